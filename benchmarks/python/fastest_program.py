#!/usr/bin/env python3
"""The tutorial's training the way a speed-minded PyTorch 2.x user writes it, to hold the course's
fastest C++ against: the tutorial's job (its ANN, cross-entropy, Adam at lr 0.001, batch 64, a new
shuffle each epoch, 5 epochs, the same accuracy bar), with
  - the dataset resident on the device, and each epoch's batches sliced from one permuted copy
    of it (no DataLoader, no copy per batch);
  - the model under torch.compile (forward and backward compiled by Inductor into fused kernels;
    on CUDA mode "reduce-overhead" replays them as CUDA graphs, "max-autotune" also tunes the
    products);
  - Adam(fused=True), its step compiled too (one kernel for every parameter);
  - each step's loss kept on the device and read once per epoch.

Run:  python3 benchmarks/python/fastest_program.py [--epochs 5] [--device cpu|cuda]
          [--mode default|reduce-overhead|max-autotune|eager] [--threads N] [--data-dir DIR]
          [--probe]
It prints each epoch's seconds (the first includes the compilation), the median of the others, and
the test accuracy; exit 0 when the accuracy reaches the bar, 1 when not, 2 when this torch has no
torch.compile (PyTorch 2.0 and later) or fused Adam for the device (CUDA: 2.0, the CPU: 2.4).
scripts/yardstick times it beside the course's C++ forms, alternating runs.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from tutorial_program import ANN  # noqa: E402  (the tutorial's model)
from training_loop import load  # noqa: E402  (a split resident on the device, beside this file)

BATCH_SIZE = 64   # the tutorial's DataLoader(batch_size=64)
LR = 0.001        # optim.Adam(model.parameters(), lr=0.001)
ACCURACY_BAR = 0.85  # lesson 05's, after 5 epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune", "eager"])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--data-dir", default=os.environ.get("GPU_LESSONS_DATA_DIR")
                        or "/usr/share/datasets/fashion-mnist")
    parser.add_argument("--probe", action="store_true",
                        help="only say whether this torch can run it (exit 0) or not (exit 2)")
    args = parser.parse_args()
    device = torch.device(args.device)
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    if args.mode != "eager" and not hasattr(torch, "compile"):
        print(f"error: torch {torch.__version__} has no torch.compile: it needs PyTorch 2\n"
              "HINT: run it with the 2.11 flavour's Python (.venv/bin/python), or --mode eager",
              file=sys.stderr)
        return 2
    if device.type == "cpu" and (major, minor) < (2, 4):
        print(f"error: torch {torch.__version__} has no fused Adam for the CPU: it needs 2.4\n"
              "HINT: run it with the 2.11 flavour's Python (.venv/bin/python)", file=sys.stderr)
        return 2
    if args.probe:
        print(f"torch {torch.__version__} can run it on {device.type}")
        return 0
    torch.set_num_threads(args.threads)
    train_x, train_y = load(args.data_dir, "train", device)
    test_x, test_y = load(args.data_dir, "t10k", device)

    torch.manual_seed(args.seed)
    model = ANN().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
    compile = (lambda f, **kw: f) if args.mode == "eager" else torch.compile
    options = {} if args.mode in ("default", "eager") else {"mode": args.mode}
    forward = compile(model, **options)

    @compile
    def adam_step():  # the compiled optimizer step: one fused kernel over every parameter
        optimizer.step()

    def step(x, y):
        optimizer.zero_grad(set_to_none=False)  # the gradients stay at their addresses
        loss = F.cross_entropy(forward(x), y)
        loss.backward()
        adam_step()
        return loss.detach()

    n = train_x.shape[0]
    seconds = []
    for epoch in range(args.epochs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.train()
        order = torch.randperm(n, device=device)
        x_epoch, y_epoch = train_x[order], train_y[order]  # one permuted copy: batches are slices
        losses = torch.empty((n + BATCH_SIZE - 1) // BATCH_SIZE, device=device)
        for k, i in enumerate(range(0, n, BATCH_SIZE)):
            losses[k] = step(x_epoch[i:i + BATCH_SIZE], y_epoch[i:i + BATCH_SIZE])
        mean_loss = losses.mean().item()  # the one wait for the device in the epoch
        seconds.append(time.perf_counter() - start)
        print(f"fastest python epoch {epoch + 1}/{args.epochs}  loss {mean_loss:.4f}  "
              f"{seconds[-1]:.3f} s", flush=True)
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    timed = seconds[1:] or seconds  # the first epoch also compiles
    print(f"fastest python: torch {torch.__version__} on {device}, {torch.get_num_threads()} "
          f"threads, mode {args.mode}: median {statistics.median(timed):.4f} s/epoch after the "
          f"first ({seconds[0]:.1f} s, compiling), test accuracy {accuracy:.4f}")
    bar = ACCURACY_BAR if args.epochs >= 5 else 0.70
    if accuracy < bar:
        print(f"error: test accuracy {accuracy:.4f} is under the bar {bar}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
