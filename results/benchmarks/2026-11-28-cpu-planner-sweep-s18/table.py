"""The report's tables from the sweep's JSON lines and the checker's log."""
import json, re, sys

def checks(path):
    out = {}
    for line in open(path):
        m = re.match(r"(\d+) .*\| (.*)$", line.strip())
        if m:
            out[int(m[1])] = m[2]
    return out

def lay(b):
    from_parts = [f"tp{b['tp']}", f"pp{b['pp']}", f"dp{b['dp']}"]
    if b["cp"] > 1: from_parts.append(f"cp{b['cp']}")
    if b["ep"] > 1: from_parts.append(f"ep{b['ep']}")
    if b["vpp"] > 1: from_parts.append(f"vpp{b['vpp']}")
    if b.get("embedding_loss_split"): from_parts.append("els")
    from_parts.append(f"mbs{b['mbs']}")
    if b["sequence_parallel"]: from_parts.append("sp")
    if b["recompute"] == "full":
        from_parts.append(f"rc=full({b['recompute_method']}/{b['recompute_num_layers']})")
    elif b["recompute"] != "none":
        from_parts.append(f"rc={b['recompute']}")
    if b["fp8"] != "off": from_parts.append(f"fp8 {b['fp8_recipe']}")
    if b["distributed_optimizer"]: from_parts.append("do")
    from_parts.append(b["impl"])
    return " ".join(from_parts)

def rows(jsonl, chk, superseded=()):
    c = checks(chk)
    for line in open(jsonl):
        r = json.loads(line)
        if r["i"] in superseded:
            continue
        label = r["label"].replace(".json", "")
        b = r.get("best")
        if b:
            ck = c.get(r["i"], "not checked")
            ck = "ok" if ck in ("ok",) or re.fullmatch(r"MFU [0-9.]+%", ck) else ck
            yield (f"| {label} | plan | {lay(b)} | {b['peak_memory_gib']:.1f} | "
                   f"{b['mfu']*100:.1f} | {b['tokens_per_s']:,.0f} | {r['s']} | {ck} |")
        else:
            err = (r["stderr"][-1] if r["stderr"] else "").replace("autotune: error: ", "")
            err = re.sub(r"/tmp/hf/|/work/wt-18a/tests/data/hf/", "", err)
            if len(err) > 150: err = err[:147] + "..."
            tb = " TRACEBACK" if r["traceback"] else ""
            yield f"| {label} | exit {r['rc']}{tb}: {err.replace('|', '/')} | | | | | {r['s']} | |"

if __name__ == "__main__":
    sup = set(int(x) for x in sys.argv[3].split(",")) if len(sys.argv) > 3 else set()
    for row in rows(sys.argv[1], sys.argv[2], sup):
        print(row)
