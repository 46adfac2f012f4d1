#!/usr/bin/env python3
"""The tutorial's Fashion-MNIST program (tutorial 000, section 8), with torch.save and torch.load.

The program is the tutorial's, line for line: the ANN (fc1, fc2, out), DataLoader(batch_size=64,
shuffle=True), CrossEntropyLoss, Adam with lr 0.001, one "Epoch N, Loss: x.xxxx" line per epoch
and "Test Accuracy: 0.xxxx" from torch.max under torch.no_grad(). Two things differ: the data come
from the IDX files of Debian's dataset-fashion-mnist through a small Dataset class (no
torchvision, no download), and flags save or load the model's state_dict the way tutorial 002
does, so that the C++ lessons can read what this program writes and the other way round:

  python3 python/tutorial_program.py --epochs 1 --save model.pt
  build/bin/lesson10_checkpointing --from-python model.pt --to-python back.pt
  python3 python/tutorial_program.py --load back.pt
  python3 python/tutorial_program.py --epochs 1 --export ann.pt2   # lesson 22 runs it from C++

  --epochs N   epochs to train (the tutorial's 5)
  --limit N    train on the first N training images only (all 10,000 test images are scored)
  --seed N     torch.manual_seed(N) first: the same weights and batches every run
  --save FILE  torch.save(model.state_dict(), FILE) after training
  --load FILE  no training: model.load_state_dict(torch.load(FILE, map_location=device,
               weights_only=True))
  --time       after each epoch's line, its seconds ("epoch time 4.21 s"; scripts/yardstick reads
               them), the clock read after the epoch's last .item(), which waits for the device
  --device D   cpu or cuda instead of the tutorial's choice (cuda when there is one)
  --export FILE  after the evaluation, the model exported with torch.export (the batch dimension
               dynamic) and compiled by AOTInductor into a package FILE (.pt2) for the device,
               its test accuracy kept in the package's metadata; written whole or not at all
  --torchvision  the tutorial's own data: torchvision's datasets.FashionMNIST with
               transform=transforms.ToTensor() (each image a PIL image, then a tensor), over
               uncompressed copies of the IDX files in a temporary folder (download=False)

Data: --data-dir, else $GPU_LESSONS_DATA_DIR, else /usr/share/datasets/fashion-mnist. Run it with
the Python whose torch matches the C++ build's LibTorch (Debian's python3-torch for the debian
flavour, .venv/bin/python for 2.11).
"""
import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset


class FashionMNIST(Dataset):
    """What datasets.FashionMNIST(root, train, transform=transforms.ToTensor()) gives: an image
    [1, 28, 28] of floats in [0, 1] and its label, read from the IDX files."""

    def __init__(self, root, train, limit=None):
        prefix = "train" if train else "t10k"
        self.images = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"))[:limit]
        self.labels = read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"))[:limit]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i].unsqueeze(0).float().div(255), int(self.labels[i])


def torchvision_datasets(data_dir, folder):
    """The tutorial's datasets.FashionMNIST(root, train, download=False,
    transform=transforms.ToTensor()) for training and test, over copies of the IDX files that
    torchvision finds where it would have downloaded them: root/FashionMNIST/raw, uncompressed."""
    from torchvision import datasets, transforms
    raw = os.path.join(folder, "FashionMNIST", "raw")
    os.makedirs(raw)
    for prefix in ("train", "t10k"):
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{prefix}-{kind}-ubyte"
            source = require_file(os.path.join(data_dir, name + ".gz"))
            with gzip.open(source, "rb") as f, open(os.path.join(raw, name), "wb") as out:
                shutil.copyfileobj(f, out)
    return [datasets.FashionMNIST(root=folder, train=train, download=False,
                                  transform=transforms.ToTensor()) for train in (True, False)]


def require_file(path):
    """`path`, or the program ends with an error naming it and the fix."""
    if not os.path.isfile(path):
        sys.exit(f"error: no {path}\nHINT: sudo apt-get install dataset-fashion-mnist, or give "
                 "--data-dir (or GPU_LESSONS_DATA_DIR) the folder of the four .gz files")
    return path


def read_idx(path):
    """An IDX file (gzipped): a magic number, the sizes, then unsigned bytes."""
    with gzip.open(require_file(path), "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


class ANN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28*28, 128)
        self.fc2 = nn.Linear(128, 64)
        self.out = nn.Linear(64, 10)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = x.view(x.size(0), -1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.out(x)   # CrossEntropyLoss = no softmax needed


# [export]
def export_package(model, device, path, accuracy):
    """The trained model as a package that C++ loads with AOTIModelPackageLoader: torch.export
    records what forward() does on an example batch as a graph of ATen operators, the batch size
    left free (Dim), and AOTInductor compiles that graph for `device` into a .pt2 file."""
    model.eval()
    example = torch.rand(64, 1, 28, 28, device=device)  # what ToTensor gives: [B, 1, 28, 28]
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
    folder = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(path)))  # renamed from here
    partial = os.path.join(folder, os.path.basename(path))                  # when whole
    torch._inductor.aoti_compile_and_package(
        program, package_path=partial,
        inductor_configs={
            # export treats sizes 0 and 1 as special, so the package's input check would
            # refuse a batch of 1; this model has nothing that depends on it
            "aot_inductor.check_lowerbound": False,
            "aot_inductor.metadata": {"test_accuracy": f"{accuracy:.4f}", "torch": torch.__version__}})
    with open(partial, "rb") as written:
        os.fsync(written.fileno())  # on the disk before it takes the name (lesson 13's rule)
    os.replace(partial, path)
    os.rmdir(folder)
    place = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(place)  # the rename on the disk too: the folder records it (lesson 13's rule)
    finally:
        os.close(place)
# [export]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--save", metavar="FILE")
    parser.add_argument("--load", metavar="FILE")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--device", choices=["cpu", "cuda"])
    parser.add_argument("--export", metavar="FILE")
    parser.add_argument("--torchvision", action="store_true")
    parser.add_argument("--data-dir", default=os.environ.get(
        "GPU_LESSONS_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    # 1. Device
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.device:
        device = torch.device(args.device)
    print("Using:", device)

    # 2. Data
    if args.torchvision:
        folder = tempfile.mkdtemp(prefix="tutorial-program-")
        try:
            train_ds, test_ds = torchvision_datasets(args.data_dir, folder)
        finally:
            shutil.rmtree(folder)  # torchvision has read the files into memory
        if args.limit is not None:
            train_ds = torch.utils.data.Subset(train_ds, range(args.limit))
    else:
        train_ds = FashionMNIST(args.data_dir, train=True, limit=args.limit)
        test_ds = FashionMNIST(args.data_dir, train=False)
    train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)
    test_loader = DataLoader(test_ds, batch_size=64)

    # 3. Model
    model = ANN().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=0.001)

    if args.load:
        # [load]
        model.load_state_dict(torch.load(args.load, map_location=device, weights_only=True))
        # [load]
        print(f"loaded {args.load} (torch {torch.__version__})")
    else:
        # 4. Training
        for epoch in range(args.epochs):
            start = time.perf_counter()
            model.train()
            total_loss = 0

            for features, labels in train_loader:
                features, labels = features.to(device), labels.to(device)

                outputs = model(features)
                loss = criterion(outputs, labels)

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

                total_loss += loss.item()

            print(f"Epoch {epoch+1}, Loss: {total_loss/len(train_loader):.4f}")
            if args.time:
                print(f"epoch time {time.perf_counter() - start:.3f} s", flush=True)
    if args.save:
        # [save]
        torch.save(model.state_dict(), args.save)
        # [save]
        print(f"saved {args.save} (torch {torch.__version__})")

    # 5. Evaluation
    model.eval()
    correct = 0
    total = 0

    with torch.no_grad():
        for features, labels in test_loader:
            features, labels = features.to(device), labels.to(device)

            outputs = model(features)
            _, predicted = torch.max(outputs, 1)

            total += labels.size(0)
            correct += (predicted == labels).sum().item()

    print(f"Test Accuracy: {correct / total:.4f}")
    if args.export:
        start = time.perf_counter()
        export_package(model, device, args.export, correct / total)
        print(f"exported {args.export} for {device.type} in {time.perf_counter() - start:.1f} s "
              f"(torch {torch.__version__})")


if __name__ == "__main__":
    main()
