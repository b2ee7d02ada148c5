import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    b = r.get("best")
    if b:
        lay = f"tp{b['tp']} pp{b['pp']} dp{b['dp']} cp{b['cp']} ep{b['ep']} vpp{b['vpp']} mbs{b['mbs']} rc={b['recompute']}" + (f"/{b['recompute_method']}{b['recompute_num_layers']}" if b['recompute']=='full' else '') + f" {b['impl']} fp8={b['fp8']}" + (" do" if b['distributed_optimizer'] else "") + (" sp" if b['sequence_parallel'] else "")
        print(r["i"], r["label"], r["rc"], r["s"], lay, f"mem={b['peak_memory_gib']:.1f}", f"mfu={b['mfu']*100:.1f}", f"tok/s={b['tokens_per_s']:.0f}", f"gbs={b['gbs']}")
    else:
        print(r["i"], r["label"], r["rc"], r["s"], "TB" if r["traceback"] else "", (r["stderr"][-1][:260] if r["stderr"] else ""))
