import sys, warnings, dataclasses
sys.path.insert(0, "tools"); warnings.filterwarnings("ignore")
import saved_tensors as st
for name, k in (("llama2-13b", 8), ("gpt2-xl", 5), ("llama3-8b", 8), ("llama3-8b", 4), ("llama3-8b", 2)):
    for qk in (False, True):
        m = dataclasses.replace(st.scaled_model(name, k), qk_layernorm=qk)
        for mbs in (1, 2):
            c = st.count_layer(m, seq=256, mbs=mbs)
            cn, mo = c.per_token
            print(f"| {m.name} | {'yes' if qk else 'no'} | {mbs} | {cn:.0f} | {mo:.0f} | {mo/cn:.4f} |")
