"""Model-state terms of the layouts whose shards are not flat ZeRO over dp, for :mod:`.memory`.

- :func:`offload_terms`: ZeRO-Offload — the optimizer (and, with ``"params"``, the parameters)
  on the host (:func:`zerokit.theory.offload_model_state_bytes`);
- :func:`hierarchical_terms`: HSDP (ZeRO-3 over a shard group of s, replicated across groups)
  and ZeRO++'s hpZ (ZeRO-3 over N plus a secondary 16-bit copy over s), :mod:`zerokit.theory.hierarchical`;
- :func:`expert_terms`: expert parallelism — the dense part over the dp ranks, the experts over
  the dp/ep ranks holding the same ones, each kind counted on its own group.

Each returns what :func:`zerokit.planner.memory.model_state_terms` returns: (device ModelStates, host bytes
per GPU, labelled terms, units).
"""
from __future__ import annotations

from .. import theory
from .terms import split_experts, theory_term, units_of


def expert_terms(sizes, layout, n, convention, largest_module):
    """ZeRO 1-3 with expert parallelism: the dense part over the N = dp ranks, the experts over the N_e = dp/ep
    ranks that hold the same experts (each kind's states counted as :func:`zerokit.theory.model_state_bytes`
    counts them on its own group)."""
    stage, ne = layout.stage, layout.edp
    dense, experts = split_experts(sizes)
    psi_d, psi_e = sum(x for x, _ in dense), sum(x for x, _ in experts)
    where = f"dense Ψ_d = {psi_d:,} over N = {n}, experts Ψ_e/ep = {psi_e:,} over N_e = dp/ep = {ne}"
    if convention.name == "deepspeed":
        d = theory.deepspeed_model_state_bytes(stage, psi_d, n, largest_module)
        e = theory.deepspeed_model_state_bytes(stage, psi_e, ne, largest_module)
        states = theory.ModelStates(d.params + e.params, d.grads + e.grads, d.optimizer + e.optimizer)
        return states, 0.0, [theory_term("params", f"params (DeepSpeed convention, stage {stage})", states.params,
                                         "dense over N, experts over N_e", where),
                             theory_term("grads", "grads", states.grads, "dense over N, experts over N_e", where),
                             theory_term("optimizer", "optimizer states", states.optimizer,
                                         "12Ψ_d/N + 12Ψ_e/N_e", "DeepSpeed's estimator on each group")], None
    du, _, dt = units_of(dense, layout)
    eu, _, et = units_of(experts, layout)
    steps = dt + et if layout.optimizer == "adamw" else 0
    d = theory.model_state_bytes(stage, psi_d, n, layout.precision, layout.optimizer, units=du,
                                 optimizer_tensors=steps)
    e = theory.model_state_bytes(stage, psi_e, ne, layout.precision, layout.optimizer, units=eu)
    states = theory.ModelStates(d.params + e.params, d.grads + e.grads, d.optimizer + e.optimizer, d.step_scalars)
    b = theory.param_bytes_per_element(layout.precision)
    k = theory.optimizer_bytes_per_element(layout.precision, layout.optimizer)
    shard = {1: ("Ψ", "Ψ", "/N"), 2: ("Ψ", "/N", "/N"), 3: ("/N", "/N", "/N")}[stage]

    def f(part, coef):
        return f"{coef}·(Ψ_d + Ψ_e/ep)" if part == "Ψ" else f"{coef}·(Ψ_d/N + (Ψ_e/ep)/N_e)"

    terms = [theory_term("params", "params", states.params, f(shard[0], b), f"{layout.precision}; {where}"),
             theory_term("grads", "grads", states.grads, f(shard[1], b), layout.precision),
             theory_term("optimizer", "optimizer states", states.optimizer, f(shard[2], "K") + f", K = {k}",
                         f"{layout.optimizer}" + (f"; + 4 B × {steps} Adam step scalars" if steps else ""))]
    return states, 0.0, terms, (du, eu)


def hierarchical_terms(psi, sizes, layout, n, convention, largest_module):
    """HSDP: ZeRO-3 over the shard group s; hpZ: ZeRO-3 over N plus a secondary 16-bit copy over s."""
    s, hsdp = layout.shard_group, layout.strategy == "hsdp"
    b = theory.param_bytes_per_element(layout.precision)
    where = (f"HSDP: sharded over a group of s = {s}, replicated over {n // s} groups" if hsdp
             else f"hpZ: ZeRO-3 over N = {n}, secondary parameter copy over s = {s} (ZeRO++)")
    if convention.name == "deepspeed":
        base = theory.deepspeed_model_state_bytes(3, psi, s if hsdp else n, largest_module)
        extra = 0 if hsdp else theory.hpz_secondary_bytes(psi, s, layout.precision)
        states = theory.ModelStates(base.params + extra, base.grads, base.optimizer)
        shard = "s" if hsdp else "N"
        terms = [theory_term("params", "params (DeepSpeed convention, stage 3)", states.params,
                             "4·L (largest layer)" + ("" if hsdp else " + 2Ψ/s (secondary copy)"), where),
                 theory_term("grads", "grads", states.grads, f"6Ψ/{shard}", "DeepSpeed's estimator"),
                 theory_term("optimizer", "optimizer states", states.optimizer, f"12Ψ/{shard}",
                             "DeepSpeed's estimator")]
        return states, 0.0, terms, None
    known = bool(sizes)
    units, persistent, tensors = units_of(sizes, layout) if known else (None, 0, 0)
    steps = tensors if known and layout.optimizer == "adamw" else 0
    k = theory.optimizer_bytes_per_element(layout.precision, layout.optimizer)
    if hsdp:
        states = theory.hsdp_model_state_bytes(psi, n, s, layout.precision, layout.optimizer, units, steps)
        shard, params_formula = "Ψ/s", f"{b}·Ψ/s"
    else:
        states = theory.hpz_model_state_bytes(psi, n, s, layout.precision, layout.optimizer, units, steps)
        shard, params_formula = "Ψ/N", f"{b}·Ψ/N + {b}·Ψ/s (secondary copy)"
    pad = "flat units padded to a multiple of the group" if units else "no padding (one buffer)"
    terms = [theory_term("params", "params", states.params, params_formula, f"{where}; {pad}"),
             theory_term("grads", "grads", states.grads, f"{b}·{shard}", layout.precision),
             theory_term("optimizer", "optimizer states", states.optimizer, f"K·{shard}, K = {k}",
                         f"{layout.optimizer}{' with an fp32 master copy' if layout.precision != 'fp32' else ''}"
                         + (f"; + 4 B × {steps} Adam step scalars" if steps else ""))]
    return states, 0.0, terms, units


def offload_terms(psi, layout, n, convention, largest_module):
    offload_params = layout.offload == "params"
    if convention.name == "deepspeed":
        states = theory.deepspeed_model_state_bytes(layout.stage, psi, n, largest_module, layout.offload)
        host = 0.0
        terms = [theory_term("params", "params on the GPU (DeepSpeed convention, offload)", states.params,
                             "4·L" if offload_params else ("4·L + 2Ψ/N" if layout.stage == 3 else "2Ψ"),
                             "DeepSpeed's estimator with the optimizer offloaded")]
        return states, host, terms, None
    device, host = theory.offload_model_state_bytes(layout.stage, psi, n, layout.optimizer, offload_params)
    k = theory.optimizer_bytes_per_element("bf16-mixed", layout.optimizer)
    params_formula = "0 (on the host)" if offload_params else ("2·Ψ/N" if layout.stage == 3 else "2·Ψ")
    terms = [theory_term("params", "params (16-bit, on the GPU)", device.params, params_formula, "ZeRO-Offload §4"),
             theory_term("grads", "grads on the GPU", device.grads, "2·Ψ" if layout.stage == 1 else "0",
                         "stage 1 reduces whole gradients; stages 2-3 stream them to the host through the buckets"),
             theory_term("host", "on the host per GPU", host.total,
                         f"{'2·Ψ/N params + ' if offload_params else ''}2·Ψ/N grads + K·Ψ/N optimizer, K = {k}",
                         "fp32 master, m, v and the 16-bit gradient shard live where the step runs")]
    return device, float(host.total), terms, None
