#!/usr/bin/env python3
"""Compares the tensors of two checkpoint step directories (every stage-*.safetensors file of
each, matched by tensor name: weights and AdamW moments) and prints the largest normwise
relative difference, max |a - b| / max |b| per tensor. Exits 1 when it is above TOLERANCE or
the two hold different tensors. Standard library only (CI has no numpy).
usage: compare_checkpoints.py STEP_DIR_A STEP_DIR_B TOLERANCE"""
import glob
import json
import os
import struct
import sys
from array import array

FORMATS = {"F64": "d", "F32": "f"}


def read_tensors(step_dir):
    tensors = {}
    files = sorted(glob.glob(os.path.join(step_dir, "stage-*.safetensors")))
    if not files:
        sys.exit(f"no stage files in {step_dir}")
    for path in files:
        with open(path, "rb") as f:
            blob = f.read()
        (header_len,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + header_len])
        data = blob[8 + header_len :]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in FORMATS:
                sys.exit(f"{path}: tensor {name} is {info['dtype']}; only F32 and F64 are compared")
            begin, end = info["data_offsets"]
            values = array(FORMATS[info["dtype"]])
            values.frombytes(data[begin:end])
            tensors[name] = values
    return tensors


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    a, b = read_tensors(sys.argv[1]), read_tensors(sys.argv[2])
    tolerance = float(sys.argv[3])
    if a.keys() != b.keys():
        print(f"different tensors: only in A {sorted(a.keys() - b.keys())}, only in B {sorted(b.keys() - a.keys())}")
        return 1
    worst, worst_name = 0.0, ""
    for name in sorted(a):
        scale = max((abs(x) for x in b[name]), default=0.0)
        diff = max((abs(x - y) for x, y in zip(a[name], b[name])), default=0.0)
        rel = diff / scale if scale > 0 else diff
        if rel > worst or not worst_name:
            worst, worst_name = rel, name
    print(f"max_rel_diff={worst:.3e} ({worst_name}, {len(a)} tensors)")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
