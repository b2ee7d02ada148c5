import json,glob,re,sys
for f in sorted(glob.glob(sys.argv[1] if len(sys.argv)>1 else '/tmp/s22/replay-*.txt')):
    t=open(f).read()
    try:
        s=t.index('{\n'); obj,_=json.JSONDecoder().raw_decode(t[s:])
    except Exception as e:
        print(f, 'not done'); continue
    tr=obj['trials']; nr=tr.get('not_run',{})
    la=re.search(r'^launches (\d+)',t,re.M).group(1)
    tb=re.search(r"search's best is ([+-][\d.]+%)",t)
    best=re.search(r'^launches \d+, best (.*) at ([\d,]+) tokens/s',t,re.M)
    print(f.split('/')[-1][7:-4], 'asks',tr['in_study'],'launches',la,'repeats',tr.get('repeats'),'slow',nr.get('predicted_slow',0),'oom',nr.get('predicted_out_of_memory',0),'best',best.group(2) if best else None,'vs true',tb.group(1) if tb else None, '|', obj['stop_reason'][:60])
