"""Qwen3-8B / Qwen2-7B: what the query and key norms and the QKV bias add, per layout (CPU)."""
import dataclasses, warnings
warnings.filterwarnings("ignore")
from autotune.specs.presets import load_model
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.layouts.layout import Layout
from autotune.predict.memory import estimate_memory
from autotune.predict.cost import estimate_cost
GiB = 2**30
c = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
rows = [
  ("tests/data/hf/qwen3-8b.json", "qk_layernorm", dict(tp=1, dp=8, mbs=1, gbs=64, impl="te", distributed_optimizer=True)),
  ("tests/data/hf/qwen3-8b.json", "qk_layernorm", dict(tp=2, dp=4, mbs=2, gbs=64, impl="te", sequence_parallel=True, distributed_optimizer=True)),
  ("tests/data/hf/qwen3-8b.json", "qk_layernorm", dict(tp=1, dp=8, mbs=1, gbs=64, impl="sdpa", distributed_optimizer=True)),
  ("tests/data/hf/qwen2-7b.json", "add_qkv_bias", dict(tp=1, dp=8, mbs=1, gbs=64, impl="te", distributed_optimizer=True)),
]
print("| model | layout | feature | peak memory without → with (GiB) | step time without → with (s) |")
print("|---|---|---|---|---|")
for path, field, lay in rows:
    m = load_model(path).with_overrides(seq_length=4096, global_batch_size=64)
    s = Layout(**lay)
    off = dataclasses.replace(m, **{field: False})
    mem = [max(st.total_bytes for st in estimate_memory(x, s, c).stages) / GiB for x in (off, m)]
    cost = [estimate_cost(x, s, c).step_time_s for x in (off, m)]
    print(f"| {m.name} | {s.describe()} | {field} | {mem[0]:.2f} → {mem[1]:.2f} ({(mem[1]/mem[0]-1)*100:+.1f}%) | {cost[0]:.3f} → {cost[1]:.3f} ({(cost[1]/cost[0]-1)*100:+.1f}%) |")
