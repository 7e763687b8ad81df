"""Compile mmspec's Triton kernels for a CUDA GPU (sm_90) without one: the compiled path's type and
control-flow errors show on a CPU machine too. Run as `python -m tests.triton_compile rejection|tree_verify`
in a process where Triton is not in interpreter mode (tests call it in a subprocess); prints one line per
kernel variant, `ok` or `FAILED: ...`."""

from __future__ import annotations

import sys

CHAIN = {"draft_ptr": "*i64", "length_ptr": "*i64"}
OUT = {"num_ptr": "*i64", "next_ptr": "*i64"}
TREE = {"tokens_ptr": "*i64", "parents_ptr": "*i64", "count_ptr": "*i64"}


def greedy_chain(target: str, from_logits: bool) -> tuple[dict, dict]:
    return ({**CHAIN, "target_ptr": target, **OUT, "K": "i32", "V": "i32", "FROM_LOGITS": "constexpr", "BLOCK": "constexpr"},
            {"FROM_LOGITS": from_logits, "BLOCK": 4096 if from_logits else 16})


def sampled_chain(probs: str, extras: bool) -> tuple[dict, dict]:
    signature = {**CHAIN, "p_ptr": probs, "q_ptr": probs, "accept_p_ptr": "*fp32", "accept_q_ptr": "*fp32",
                 "excluded_ptr": "*u8", "uniform_ptr": "*fp32", "noise_ptr": "*fp32", **OUT, "K": "i32", "V": "i32",
                 "HAS_Q": "constexpr", "HAS_ACCEPT_P": "constexpr", "HAS_ACCEPT_Q": "constexpr",
                 "HAS_EXCLUDED": "constexpr", "BLOCK": "constexpr"}
    return signature, {"HAS_Q": extras, "HAS_ACCEPT_P": extras, "HAS_ACCEPT_Q": extras, "HAS_EXCLUDED": extras,
                       "BLOCK": 2048}


def greedy_tree(target: str, from_logits: bool) -> tuple[dict, dict]:
    return ({**TREE, "target_ptr": target, "path_ptr": "*i64", **OUT, "N": "i32", "V": "i32",
             "FROM_LOGITS": "constexpr", "BLOCK_N": "constexpr", "BLOCK": "constexpr"},
            {"FROM_LOGITS": from_logits, "BLOCK_N": 64, "BLOCK": 4096 if from_logits else 16})


def sampled_tree(probs: str, with_q: bool) -> tuple[dict, dict]:
    return ({**TREE, "p_ptr": probs, "q_ptr": probs, "uniform_ptr": "*fp32", "noise_ptr": "*fp32",
             "p_work_ptr": "*fp32", "q_work_ptr": "*fp32", "path_ptr": "*i64", **OUT, "N": "i32", "V": "i32",
             "HAS_Q": "constexpr", "BLOCK_N": "constexpr", "BLOCK": "constexpr"},
            {"HAS_Q": with_q, "BLOCK_N": 16, "BLOCK": 2048})


def cases(module: str) -> list[tuple[str, tuple[dict, dict]]]:
    if module == "rejection":
        return [("greedy_chain_kernel", greedy_chain("*bf16", True)), ("greedy_chain_kernel", greedy_chain("*i64", False)),
                ("sampled_chain_kernel", sampled_chain("*fp32", True)),
                ("sampled_chain_kernel", sampled_chain("*bf16", False))]
    return [("greedy_tree_kernel", greedy_tree("*fp32", True)), ("greedy_tree_kernel", greedy_tree("*i64", False)),
            ("sampled_tree_kernel", sampled_tree("*fp32", True)), ("sampled_tree_kernel", sampled_tree("*bf16", False))]


def main(module: str) -> int:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = importlib.import_module(f"mmspec.kernels.{module}_kernels")
    failed = 0
    for name, (signature, constexprs) in cases(module):
        source = ASTSource(fn=triton.jit(getattr(kernels, name)), signature=signature, constexprs=constexprs)
        try:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
            ptx = compiled.asm["ptx"]
            # exact division (the references divide in IEEE float32), never an approximate one
            assert "div.full" not in ptx and "div.approx" not in ptx, "approximate division in the PTX"
            print(f"{name} {sorted(constexprs.items())}: ok")
        except Exception as error:  # noqa: BLE001 - reported to the calling test
            failed += 1
            print(f"{name} {sorted(constexprs.items())}: FAILED: {type(error).__name__}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
