"""What a GPU run should measure for the static-shape compiled path (not a test; prints one table).

    HF_HUB_OFFLINE=1 python -m tests.gpu.measure_static_compiled [--layers 16 --hidden 2048]

A random Llama (1B-shaped by default; --layers 32 --hidden 4096 for 7B) in bfloat16, and a drafter made of its
own first layers with the rest made inert (`mmspec.bench.text.inert_layer_pair`), so every draft is accepted and
tau = k + 1. Rows: one eager target step, one compiled (CUDA-graph) verify step of k + 1 positions, the
bandwidth bound of a step (weight bytes / --bandwidth), then whole decodes: eager `generate`, static-cache
compiled `generate`, mmspec eager, mmspec compiled. Every decode is checked against eager `generate`.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mmspec import SpeculativeDecoder
from mmspec.bench.text import inert_layer_pair, static_cache_compile_config
from mmspec.policies import FixedDraftLength
from mmspec.sampling import SamplingConfig
from mmspec.static_target import StaticModelDrafter, StaticTarget, verify_widths


def timed(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--drafter-layers", type=int, default=2)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s (H200: 4.8e12, H100 SXM: 3.35e12)")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.6875),
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
                         num_key_value_heads=args.hidden // 128, max_position_embeddings=4096)
    base = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    target, drafter = inert_layer_pair(base, args.drafter_layers)
    prompt = torch.randint(3, 32000, (1, 64), device="cuda")
    n, k = args.new_tokens, args.k
    expected = target.generate(prompt, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    rows: list[tuple[str, float]] = []

    with torch.inference_mode():
        static = StaticTarget(target, widths=(k + 1,), max_cache_len=prompt.shape[1] + n + k + 1)
        static.warm_up()
        static.prefill(prompt)
        step = prompt[:, -1:].expand(1, k + 1).contiguous()

        def verify_step():
            static.extend(step)
            static.truncate(prompt.shape[1])

        rows.append((f"compiled verify step ({k + 1} positions)", timed(verify_step, 50)))
        cache = None

        def eager_step():
            nonlocal cache
            out = target(prompt[:, -1:], use_cache=True) if cache is None else target(prompt[:, -1:], cache=cache)
            cache = out.cache

        rows.append(("eager one-token step (growing cache)", timed(eager_step, 50)))
        rows.append(("bandwidth bound of a step (weights only)", weight_bytes / args.bandwidth))

        def check(tokens: torch.Tensor, name: str) -> None:
            if not torch.equal(tokens, expected):
                raise SystemExit(f"{name}: output differs from eager generate")

        def plain():
            check(target.generate(prompt, do_sample=False, max_new_tokens=n, min_new_tokens=n), "generate")

        compile_config = static_cache_compile_config(prompt.device)

        def plain_static():
            check(target.generate(prompt, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                  cache_implementation="static", compile_config=compile_config), "generate-static")

        policy = FixedDraftLength(k)
        eager = SpeculativeDecoder(target, drafter, policy=policy)
        compiled = SpeculativeDecoder(StaticTarget(target, widths=verify_widths(policy)), StaticModelDrafter(drafter),
                                      policy=policy)

        def spec(decoder, name):
            def run():
                out = decoder.generate(prompt, max_new_tokens=n, min_new_tokens=n, sampling=SamplingConfig())
                check(out.sequences, name)
            return run

        for name, fn in (("generate eager", plain), ("generate static compiled", plain_static),
                         ("mmspec eager", spec(eager, "mmspec eager")), ("mmspec compiled", spec(compiled, "mmspec compiled"))):
            fn()  # warm-up / compile
            rows.append((f"{name} ({n} tokens)", timed(fn, 3)))
    print(f"{args.layers} layers x {args.hidden}, bfloat16, weights {weight_bytes / 1e9:.2f} GB, k={k}, "
          f"{torch.cuda.get_device_name()}")
    for name, seconds in rows:
        print(f"{name:<48} {seconds * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
