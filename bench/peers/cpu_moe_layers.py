"""The --n-cpu-moe that fits llama.cpp's GPU share of a GGUF within a VRAM budget: the fewest layers
whose routed experts stay on the CPU so that every other tensor, the experts of the remaining
layers and OVERHEAD_GIB (KV cache and compute buffers) fit in BUDGET_GIB. gguf-py from the
llama.cpp archive (PYTHONPATH) and Debian's numpy.
usage: cpu_moe_layers.py MODEL.gguf BUDGET_GIB [OVERHEAD_GIB (default 0.75)]"""
import re
import sys

from gguf import GGUFReader

path, budget = sys.argv[1], float(sys.argv[2]) * 2**30
overhead = float(sys.argv[3] if len(sys.argv) > 3 else 0.75) * 2**30
experts, rest = {}, 0
for t in GGUFReader(path).tensors:
    m = re.match(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.", t.name)
    if m:
        experts[int(m.group(1))] = experts.get(int(m.group(1)), 0) + int(t.n_bytes)
    else:
        rest += int(t.n_bytes)
layers = sorted(experts)
for n in range(len(layers) + 1):  # llama.cpp keeps the experts of the first n layers on the CPU
    if rest + overhead + sum(experts[i] for i in layers[n:]) <= budget:
        print(n)
        break
else:
    sys.exit(f"{path}: even with every layer's experts on the CPU the rest ({rest / 2**30:.2f} GiB) exceeds the budget")
