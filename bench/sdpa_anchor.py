#!/usr/bin/env python3
"""The anchor for bench/attention_bench.cu: PyTorch's fused scaled-dot-product attention
(torch.nn.functional.scaled_dot_product_attention, causal, bf16) on the same shapes, timed the
same way (CUDA events, one warm-up, median of --reps). Needs PyTorch with a GPU.

    python3 bench/sdpa_anchor.py [--len 32768] [--heads 16] [--kv-heads H] [--head-dim 128] [--reps 10]

One row for PyTorch's own choice of backend, then one for each backend forced (flash, cuDNN)
where it runs the shape. --kv-heads < --heads groups the K/V heads (enable_gqa).
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--len", type=int, default=32768)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=0, help="K/V heads (default: --heads)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    kv_heads = a.kv_heads or a.heads
    gqa = kv_heads != a.heads
    q = torch.randn((1, a.heads, a.len, a.head_dim), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn((1, kv_heads, a.len, a.head_dim), device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    dout = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
    attend = (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)) if gqa else \
        (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def fwd():
        with torch.no_grad():
            attend()

    def fwd_bwd():
        attend().backward(dout)

    flops = 4.0 * a.head_dim * a.len * (a.len + 1) / 2 * a.heads
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: SDPA causal bf16, B 1, {a.heads} query / "
          f"{kv_heads} K/V heads of {a.head_dim}, T {a.len}, median of {a.reps}")
    print(f"| backend | forward ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s |\n| --- | ---: | ---: | ---: | ---: |")
    for name, backend in [("default", None), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
        try:
            if backend is None:
                f, fb = median_ms(fwd, a.reps), median_ms(fwd_bwd, a.reps)
            else:
                with sdpa_kernel([backend]):
                    f, fb = median_ms(fwd, a.reps), median_ms(fwd_bwd, a.reps)
        except RuntimeError as e:  # the backend does not run this shape
            print(f"| {name} | not run: {str(e).splitlines()[0][:80]} | | | |")
            continue
        print(f"| {name} | {f:.3f} | {fb:.3f} | {flops / f * 1e-9:.1f} | {3.5 * flops / fb * 1e-9:.1f} |")


if __name__ == "__main__":
    main()
