#!/bin/sh
# tutorial_program.sh PYTHON PROGRAM: the tutorial's Python program on torchvision's FashionMNIST
# (--torchvision, what the yardstick times) and on its own IDX Dataset trains the same model on
# the same batches: one epoch on 2,000 images from one seed prints the same loss and accuracy.
# Exit 77 (skipped) without a Python with torch, or when it has no torchvision.
python=$1 program=$2
[ -n "$python" ] || { echo "no Python with this build's torch"; exit 77; }
"$python" -c 'import torchvision' 2>/dev/null || { echo "$python has no torchvision"; exit 77; }
tv=$(CUDA_VISIBLE_DEVICES= "$python" "$program" --epochs 1 --limit 2000 --torchvision) || exit 1
own=$(CUDA_VISIBLE_DEVICES= "$python" "$program" --epochs 1 --limit 2000) || exit 1
echo "torchvision: $tv"
echo "own Dataset: $own"
echo "$tv" | grep -q '^Test Accuracy: 0\.[0-9]*$' || { echo "FAIL: no accuracy line"; exit 1; }
[ "$tv" = "$own" ] || { echo "FAIL: the two datasets trained differently"; exit 1; }
