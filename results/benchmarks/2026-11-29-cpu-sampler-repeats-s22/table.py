import json,glob,re,statistics as st
def read(f):
    t=open(f).read()
    s=t.index('{\n'); obj,_=json.JSONDecoder().raw_decode(t[s:])
    tr=obj['trials']
    la=int(re.search(r'^launches (\d+)',t,re.M).group(1))
    tb=float(re.search(r"search's best is ([+-][\d.]+)%",t).group(1))
    return tr['in_study'], tr.get('repeats',0), la, tb
groups=[("llama3-8b, 4 x H200","l8x4",[("0",[0]),("0.1",list(range(10)))]),
        ("llama3-8b, 8 x H200","l8x8",[("0",[0]),("0.1",[0,1,2])]),
        ("gpt2-xl, 1 x H200","g2",[("0",[0]),("0.1",[0,1,2])]),
        ("llama-3.2-3b, 1 x H200","l3b",[("0",[0]),("0.1",[0,1,2])])]
def path(pre,tag,p,s):
    if pre=="l8x4" and (p=="0" or s<5):
        return f"/tmp/s22/replay-{tag}-p{p}-s{s}.txt"
    return f"/tmp/s22/replay-{pre}-{tag}-p{p}-s{s}.txt"
for name,pre,cases in groups:
    for p,seeds in cases:
        row={}
        for tag in ("before","after"):
            try: rs=[read(path(pre,tag,p,s)) for s in seeds]
            except Exception as e: rs=None
            row[tag]=rs
        if not row["before"] or not row["after"]: print(name,p,"missing"); continue
        m=lambda rs,i: st.mean(r[i] for r in rs)
        b,a=row["before"],row["after"]
        print(f"| {name} | {p} | {len(seeds)} | {m(b,0):.1f} | **{m(a,0):.1f}** | {m(b,1):.1f} | **{m(a,1):.1f}** | {m(b,2):.1f} | {m(a,2):.1f} | {m(b,3):+.1f}% | {m(a,3):+.1f}% |")
        if len(seeds)>1:
            print("   per seed launches", [r[2] for r in b],"->",[r[2] for r in a],"best",[r[3] for r in b],"->",[r[3] for r in a], "asks",[r[0] for r in b],"->",[r[0] for r in a])
