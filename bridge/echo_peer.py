"""A numpy-only peer that answers every prompt at once: uniform probabilities, status ok, and the prompt's
first bytes as the reason. It measures the bridge itself (benchmarks, transport tests).

Run by SidecarClient.start(command=bridge.ECHO_PEER_COMMAND); options: --delay-s (sleep before answering),
--bad KIND (fault injection: answers the client must refuse).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bridge import peer
from bridge.protocol import NUM_ACTIONS, STATUS_OK
from bridge.transport import PEER_READY, PEER_STOPPED

BAD_ANSWERS = ("nan_probs", "negative_probs", "inf_confidence", "action", "env_id")


def _spoil(kind: str, request, probs, action, confidence):
    """The answers of --bad KIND: each breaks one thing the client checks."""
    if kind == "nan_probs":
        probs[:] = np.nan
    elif kind == "negative_probs":
        probs[:, 0], probs[:, 1] = -0.5, 1.0 / NUM_ACTIONS + 0.5
    elif kind == "inf_confidence":
        confidence[:] = np.inf
    elif kind == "action":
        action[:] = NUM_ACTIONS + 3
    elif kind == "env_id":
        request.keys[:] = 1_000_000  # echoed back by write_answers
    return probs, action, confidence


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bridge.echo_peer", description=__doc__)
    peer.add_transport_arguments(parser)
    parser.add_argument("--backend", default="echo", help="ignored; accepted so clients can pass it")
    parser.add_argument("--delay-s", type=float, default=0.0, help="sleep this long before answering each request")
    parser.add_argument("--version", type=int, default=0, help="report the answers as given by this advisor version "
                        "(a LoRA-learning sidecar's adopted rounds)")
    parser.add_argument("--bad", choices=BAD_ANSWERS, help="answer every row wrongly, with status ok: NaN or negative "
                        "probabilities, infinite confidence, an action or key out of range")
    args = parser.parse_args(argv)
    peer.exit_on_sigterm_only()
    endpoint = peer.connect(args)
    endpoint.version = args.version
    peer.start_heartbeat(endpoint, args.parent_pid, (args.request_shm, args.response_shm))
    width = min(endpoint.reason_bytes, endpoint.prompt_bytes)
    uniform = np.full((endpoint.capacity, NUM_ACTIONS), 1.0 / NUM_ACTIONS, dtype=np.float32)
    zeros = np.zeros(endpoint.capacity, dtype=np.int8)
    ones = np.ones(endpoint.capacity, dtype=np.float32)
    try:
        endpoint.set_state(PEER_READY)
        endpoint.response_signal.post()
        while not endpoint.stop_requested:
            request = endpoint.wait_request(timeout_s=0.5)
            if request is None:
                continue
            if args.delay_s:
                time.sleep(args.delay_s)
            n = len(request)
            echoed = np.ascontiguousarray(request.prompts[:, :width]).view(f"S{width}").ravel()
            probs, action, confidence = uniform[:n].copy(), zeros[:n].copy(), ones[:n].copy()
            if args.bad:
                probs, action, confidence = _spoil(args.bad, request, probs, action, confidence)
            endpoint.write_answers(request, slice(0, n), probs, action, confidence, np.full(n, STATUS_OK, np.int8),
                                   echoed)
    finally:
        endpoint.set_state(PEER_STOPPED)
        endpoint.close()


if __name__ == "__main__":
    main()
