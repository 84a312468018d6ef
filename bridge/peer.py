"""What every sidecar process needs: its transport arguments, a heartbeat, parent watching and clean signals."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from bridge.transport import PeerEndpoint, unlink_by_name

HEARTBEAT_INTERVAL_S = 0.25


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags SidecarClient passes when it spawns a peer (not meant to be typed by hand)."""
    group = parser.add_argument_group("transport (set by SidecarClient)")
    group.add_argument("--request-shm", required=True, help="name of the request shared-memory segment")
    group.add_argument("--response-shm", required=True, help="name of the response shared-memory segment")
    group.add_argument("--request-fd", type=int, required=True, help="inherited eventfd the client posts on submit")
    group.add_argument("--response-fd", type=int, required=True, help="inherited eventfd the peer posts on answers")
    group.add_argument("--parent-pid", type=int, required=True, help="exit and unlink the segments if this pid dies")


def connect(args: argparse.Namespace) -> PeerEndpoint:
    return PeerEndpoint(args.request_shm, args.response_shm, args.request_fd, args.response_fd)


def exit_on_sigterm_only() -> None:
    """SIGTERM ends the peer through SystemExit, so `finally` blocks close the mappings. SIGINT is ignored: a
    terminal's Ctrl-C reaches the whole process group, and the client decides when its peer stops (a trainer
    finishes its update and has the advisor save its adapter first)."""

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, handler)


def start_heartbeat(endpoint: PeerEndpoint, parent_pid: int, names: tuple[str, str]) -> threading.Thread:
    """A daemon thread that stamps the heartbeat while the main thread computes, and watches the parent.

    If the parent dies (SIGKILL included) no client is left to unlink the segments, so this thread unlinks
    them and ends the process at once, even in the middle of a forward pass.
    """

    def beat():
        while True:
            if os.getppid() != parent_pid:
                for name in names:
                    unlink_by_name(name)
                print("[sidecar] parent process is gone; unlinked shared memory and exiting", file=sys.stderr)
                os._exit(0)
            endpoint.heartbeat()
            threading.Event().wait(HEARTBEAT_INTERVAL_S)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return thread
