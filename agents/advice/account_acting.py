"""Acting with advice on an account of several instruments (jaxenv.account_env.AccountEnv, issue 77): each head is
the one-instrument acting step (agents.advice.acting.HybridActing) on its instrument, in the env's fixed order.

Head i sees its instrument as a one-instrument env sees it: its position in the account's books
(jaxenv.account_env.leg_state), its instrument's params, its row of the observation, its own advice table (keys of its
instrument: block, side) with its own veto, rules and record. Its mask is the env's sequential mask given the actions
the heads before it executed, so the account rules hold and no head can take an action the env forbids; the veto and
the entry rules then narrow it as for one instrument.

The carry is a tuple of one HybridCarry per instrument (each per-env leaf keeps its [N] rows first, so the env mesh
shards them as for one instrument). PPO's log-probability is the sum over heads of each head's, under the mask it had
(stored per head), so the loss recomputes it exactly. A head whose action the advice replaced (`rules` and `switch`
fusion: its policy-gradient weight 0) leaves the sum: the step's ratio is that of the heads whose policy chose, given
the actions the others executed, and the step carries a policy gradient wherever one head's policy chose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agents.advice.acting import HybridActing
from bridge.protocol import HOLD
from jaxenv.account_env import leg_state


def instrument(tree: Any, i: int) -> Any:
    """Instrument i's slice of leaves with the instrument axis first (AccountParams.inst)."""
    return jax.tree.map(lambda x: x[i], tree)


def leg(env_state, i: int):
    """TradingEnv's state [N] of instrument i in the account states [N]."""
    return leg_state(env_state, jax.tree.map(lambda x: x[:, i], env_state.legs))


@dataclass(frozen=True)
class AccountActing:
    """HybridActing on each head of an account env (the module's docstring); the same interface, so
    agents.rl.ppo.make_train takes either."""

    single: HybridActing  # one head's acting, as on one instrument
    env: Any  # jaxenv.account_env.AccountEnv
    head_stats: bool = False  # each head's extras keep its step's stats (a live decision shows them); training's not

    @property
    def fusion(self) -> str:
        return self.single.fusion

    @property
    def gated(self) -> bool:
        return self.single.gated

    def walking(self, greedy: bool) -> AccountActing:
        """This acting for a walk: greedy (each head's most probable action of its acting distribution) or sampled."""
        return dataclasses.replace(self, single=dataclasses.replace(self.single, greedy=greedy))

    def trust_gate(self):
        return self.single.trust_gate()

    def optimizer_scaling(self):
        return self.single.optimizer_scaling()

    def init_carry(self, n_envs: int, env_params) -> tuple:
        return tuple(self.single.init_carry(n_envs, instrument(env_params.inst, i))
                     for i in range(env_params.num_instruments))

    def look(self, carry: tuple, env_state, env_params) -> tuple:
        return tuple(self.single.look(c, leg(env_state, i), instrument(env_params.inst, i))
                     for i, c in enumerate(carry))

    def act(self, network, params, carry: tuple, logits, env_mask, obs, env_state, env_params, key):
        """logits [N, I, A], obs the raw AccountObs, env_state the account states [N] → (executed actions [N, I],
        the actions PPO learns from [N, I], their joint log-prob [N], each head's mask [N, I, A], each head's extras
        (a tuple), the new carry). `env_mask` is not read: each head's mask is the env's sequential one."""
        del env_mask
        env, n = self.env, logits.shape[0]
        own = jax.vmap(env.instrument_masks, in_axes=(0, None))(env_state, env_params)
        taken = jnp.full((n, env_params.num_instruments), HOLD, jnp.int32)
        heads = []
        for i, k in enumerate(jax.random.split(key, env_params.num_instruments)):
            mask = jax.vmap(lambda s, t, m: env.sequential_mask(s, env_params, i, t, m))(env_state, taken, own)
            out = self.single.act(network, params, carry[i], logits[:, i], mask, obs.instruments[:, i],
                                  leg(env_state, i), instrument(env_params.inst, i), k)
            taken = taken.at[:, i].set(out[0].astype(jnp.int32))
            heads.append(out)
        action, learn_action, log_prob, mask, extras, new_carry = zip(*heads)
        joint = sum(lp * e.pg_weight for lp, e in zip(log_prob, extras))
        extras = AccountExtras(tuple(e if self.head_stats else e._replace(stats={}) for e in extras),
                               _summed([e.stats for e in extras]))
        return (jnp.stack(action, 1), jnp.stack(learn_action, 1), joint, jnp.stack(mask, 1), extras,
                tuple(new_carry))

    @staticmethod
    def loss_extras(extras):
        return extras.heads

    def log_prob_entropy(self, network, params, logits, mask, extras: tuple, action):
        """The joint log-prob of `action` [..., I] over the heads whose policy chose (the module's docstring), the
        entropy summed over heads, and the policy-gradient weight (1 where one head's policy chose)."""
        log_prob = entropy = weight = 0.0
        for i, head in enumerate(extras):
            lp, ent, w = self.single.log_prob_entropy(network, params, logits[..., i, :], mask[..., i, :], head,
                                                      action[..., i])
            # w is 0 or 1 (HybridActing's pg_weight: the advice overrode the head or not)
            log_prob, entropy, weight = log_prob + lp * w, entropy + ent, jnp.maximum(weight, w)
        return log_prob, entropy, weight


def _summed(stats: list[dict]) -> dict:
    """The heads' per-step sums, added over heads (decisions count one per head)."""
    return {k: sum(s[k] for s in stats) for k in stats[0]}


class AccountExtras(NamedTuple):
    """A step's extras: each head's (a tuple: what the loss reads) and, as one head's extras carry them, the per-step
    sums over heads for the metrics."""

    heads: tuple
    stats: dict
