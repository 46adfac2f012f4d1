"""Writes the fuzz targets' seed corpus (fuzz/corpus/): small state_dicts saved by Python's torch
(run it with each flavour's Python: /usr/bin/python3 for 1.13, .venv/bin/python for 2.11) and
small IDX files, plain and gzipped. Usage: python make_seeds.py FUZZ_DIR"""
import gzip
import os
import struct
import sys

import torch

fuzz = sys.argv[1]
out = os.path.join(fuzz, "corpus", "fuzz_checkpoint")
tag = "py" + ".".join(torch.__version__.split(".")[:2])
torch.manual_seed(0)
linear = torch.nn.Linear(3, 2)
torch.save(linear.state_dict(), f"{out}/{tag}-linear-state_dict.pt")
torch.save(dict(linear.state_dict()), f"{out}/{tag}-plain-dict.pt")
torch.save({"w": torch.arange(6.0).reshape(2, 3), "n": 3}, f"{out}/{tag}-dict-with-int.pt")
torch.save([torch.ones(2)], f"{out}/{tag}-list.pt")
seq = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
state = seq.state_dict()
state["0.weight"] = state["0.weight"].t()  # a transposed (non-contiguous) tensor
torch.save(state, f"{out}/{tag}-transposed.pt")
if hasattr(torch.serialization, "set_crc32_options"):  # 2.x: a file with every CRC-32 left 0
    torch.serialization.set_crc32_options(False)
    torch.save(linear.state_dict(), f"{out}/{tag}-no-crc32.pt")
    torch.serialization.set_crc32_options(True)
if tag == "py1.13":
    torch.save(linear.state_dict(), f"{out}/{tag}-legacy-format.pt",
               _use_new_zipfile_serialization=False)

out = os.path.join(fuzz, "corpus", "fuzz_idx")


def idx(shape, data):
    return bytes([0, 0, 8, len(shape)]) + b"".join(struct.pack(">I", n) for n in shape) + bytes(data)


labels = idx([10], range(10))
images = idx([2, 3, 4], [i * 10 % 256 for i in range(24)])
for name, data in [("labels-plain.idx", labels), ("images-plain.idx", images),
                   ("four-dims-plain.idx", idx([1, 2, 1, 2], [1, 2, 3, 4])),
                   ("labels.idx.gz", gzip.compress(labels, mtime=0)),
                   ("images.idx.gz", gzip.compress(images, mtime=0))]:
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
