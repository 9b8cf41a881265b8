#!/usr/bin/env python3
"""Round trip between stateflow and flash-linear-attention's GatedDeltaNetForCausalLM, on a GPU
machine with PyTorch, transformers and fla installed (docs/guide.md, "Hugging Face / fla").

    tools/fla_roundtrip.py --stateflow build/stateflow --work /tmp/rt [--device-cuda]

1. stateflow -> fla: trains a small model with stateflow (CPU, a few steps on a text corpus it
   writes), exports it (`stateflow export --format hf`), loads the folder with transformers
   after `import fla`, and runs the same held-out window through both: the loss (f32) and the
   logits are compared (stateflow's from `stateflow eval --logits-out`).
2. fla -> stateflow: builds a freshly initialised fla model, saves it with save_pretrained,
   imports it (`stateflow import --format hf`), evaluates the same window with both, then exports
   it again and checks every tensor is bitwise fla's.
With --device-cuda, stateflow also evaluates and generates on the GPU (bf16 GEMMs), and its
greedy continuation is compared with fla's. Prints one line per comparison and exits 1 when a
loss differs by more than --loss-tol (relative) or a logit by more than --logit-tol (relative to
the largest logit); stateflow's GPU run is held to the bf16 band (--bf16-tol).
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

import fla  # noqa: F401  registers the gated_deltanet model type with transformers
from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM
from transformers import AutoModelForCausalLM

# GPU-kernel compatible (heads of 128, inner block 64) and small.
CONFIG = {"preset": "small", "d_model": 256, "pattern": "GG", "mlp_hidden": 512,
          "gdn": {"heads": 2, "head_dk": 128, "head_dv": 128, "block_size": 64}}
WINDOW = 256  # tokens evaluated (the window holds WINDOW + 1 bytes)


def sh(args, log):
    print("$", " ".join(args), flush=True)
    r = subprocess.run(args, capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(f"failed ({r.returncode}): {' '.join(args)}")
    return r.stdout


def stateflow_eval(bin_, ckpt, window, work, tag, device="cpu"):
    logits = os.path.join(work, f"logits-{tag}.safetensors")
    out = sh([bin_, "eval", "--resume", ckpt, "--data", "text", "--data-path", window, "--seq-len", str(WINDOW),
              "--eval-tokens", str(WINDOW), "--chunk-len", "100", "--device", device, "--logits-out", logits],
             os.path.join(work, f"eval-{tag}.log"))
    loss = float([l for l in out.splitlines() if l.startswith("eval_loss=")][0].split("=")[1])
    return loss, load_file(logits)["logits"].double()


def fla_eval(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)  # fla shifts the labels: WINDOW targets
    return out.loss.item(), out.logits[0, :WINDOW].double().cpu()


def compare(what, a, b, tol, failures):
    err = ((a - b).abs().max() / b.abs().max()).item() if torch.is_tensor(a) else abs(a - b) / abs(b)
    ok = err <= tol
    print(f"{what}: {'ok' if ok else 'FAILED'}  relative difference {err:.3e} (tolerance {tol:.0e})"
          + (f"  [{a:.6f} vs {b:.6f}]" if not torch.is_tensor(a) else ""), flush=True)
    if not ok:
        failures.append(what)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stateflow", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--device-cuda", action="store_true", help="also run stateflow on the GPU")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--loss-tol", type=float, default=1e-4)
    p.add_argument("--logit-tol", type=float, default=1e-3)
    p.add_argument("--bf16-tol", type=float, default=3e-2)
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    w = lambda name: os.path.join(a.work, name)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, fla {getattr(fla, '__version__', '?')}, "
          f"GPU {torch.cuda.get_device_name(0)}", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32 on fla's side too, where torch decides
    torch.backends.cudnn.allow_tf32 = False

    corpus = "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7 % 13}.\n" for i in range(3000))
    held = "".join(f"held out {i}: a lazy dog sleeps while the quick fox runs {i % 5}.\n" for i in range(20))
    open(w("corpus.txt"), "w").write(corpus)
    open(w("window.txt"), "w").write(held[:WINDOW + 1])
    ids = torch.tensor([list(held[:WINDOW + 1].encode())], device="cuda")
    json.dump(CONFIG, open(w("model.json"), "w"))
    failures = []

    # 1. stateflow -> fla
    sh([a.stateflow, "train", "--config", w("model.json"), "--data", "text", "--data-path", w("corpus.txt"),
        "--steps", str(a.steps), "--seq-len", "128", "--batch", "8", "--stages", "1", "--microbatches", "1",
        "--chunks", "2", "--log-every", str(a.steps), "--save-dir", w("sf_run")], w("train.log"))
    sh([a.stateflow, "export", "--resume", w("sf_run"), "--format", "hf", w("sf_hf")], w("export.log"))
    model = AutoModelForCausalLM.from_pretrained(w("sf_hf")).float().cuda().eval()
    print(f"fla loaded stateflow's export as {type(model).__name__}", flush=True)
    fla_loss, fla_logits = fla_eval(model, ids)
    sf_loss, sf_logits = stateflow_eval(a.stateflow, w("sf_run"), w("window.txt"), a.work, "cpu")
    compare("stateflow->fla: loss, stateflow CPU f32 vs fla f32", sf_loss, fla_loss, a.loss_tol, failures)
    compare("stateflow->fla: logits, stateflow CPU f32 vs fla f32", sf_logits, fla_logits, a.logit_tol, failures)
    if a.device_cuda:
        gpu_loss, gpu_logits = stateflow_eval(a.stateflow, w("sf_run"), w("window.txt"), a.work, "cuda", "cuda")
        compare("stateflow->fla: loss, stateflow GPU (bf16 GEMMs) vs fla f32", gpu_loss, fla_loss, a.bf16_tol,
                failures)
        compare("stateflow->fla: logits, stateflow GPU (bf16 GEMMs) vs fla f32", gpu_logits, fla_logits,
                a.bf16_tol, failures)
        prompt = "held out 3: a lazy"
        out = sh([a.stateflow, "generate", "--resume", w("sf_run"), "--device", "cuda", "--prompt", prompt,
                  "--max-new-tokens", "32", "--temperature", "0", "--prompt-chunk", "5"], w("generate-cuda.log"))
        cpu = sh([a.stateflow, "generate", "--resume", w("sf_run"), "--prompt", prompt, "--max-new-tokens", "32",
                  "--temperature", "0"], w("generate-cpu.log"))
        try:
            with torch.no_grad():
                g = model.generate(torch.tensor([list(prompt.encode())], device="cuda"), max_new_tokens=32,
                                   do_sample=False)
            fla_text = bytes(g[0].tolist()).decode("latin-1")
        except Exception as e:  # generation is informative only: report, go on with the rest
            fla_text = f"(fla generate failed: {type(e).__name__}: {e})"
        same = lambda x, y: next((i for i, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
        print(f"greedy generation, 32 new tokens: stateflow GPU {out.strip()!r}; stateflow CPU {cpu.strip()!r}; "
              f"fla {fla_text!r}; GPU/CPU agree on {same(out, cpu) - len(prompt)}, CPU/fla on "
              f"{same(cpu, fla_text) - len(prompt)} new tokens", flush=True)

    # 2. fla -> stateflow
    cfg = GatedDeltaNetConfig(hidden_size=256, num_hidden_layers=2, num_heads=2, head_dim=128, expand_v=1.0,
                              intermediate_size=512, vocab_size=256, norm_eps=1e-5)
    fresh = GatedDeltaNetForCausalLM(cfg).float()
    fresh.save_pretrained(w("fla_hf"), safe_serialization=True)
    fresh = fresh.cuda().eval()
    fla_loss2, fla_logits2 = fla_eval(fresh, ids)
    sh([a.stateflow, "import", "--format", "hf", w("fla_hf"), "--save-dir", w("imported")], w("import.log"))
    sf_loss2, sf_logits2 = stateflow_eval(a.stateflow, w("imported"), w("window.txt"), a.work, "imported")
    compare("fla->stateflow: loss, stateflow CPU f32 vs fla f32", sf_loss2, fla_loss2, a.loss_tol, failures)
    compare("fla->stateflow: logits, stateflow CPU f32 vs fla f32", sf_logits2, fla_logits2, a.logit_tol, failures)
    sh([a.stateflow, "export", "--resume", w("imported"), "--format", "hf", w("rt_hf")], w("export2.log"))
    theirs, back = load_file(os.path.join(w("fla_hf"), "model.safetensors")), load_file(w("rt_hf/model.safetensors"))
    differ = [k for k in theirs if k not in back or not torch.equal(theirs[k].float(), back[k])]
    print(f"fla->stateflow->fla: {len(theirs)} tensors, {'all bitwise equal' if not differ else f'differ: {differ}'}"
          f"{'' if set(theirs) == set(back) else f'; names differ: {sorted(set(theirs) ^ set(back))}'}", flush=True)
    if differ or set(theirs) != set(back):
        failures.append("fla->stateflow->fla tensors")
    print("FAILED: " + ", ".join(failures) if failures else "all comparisons passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
