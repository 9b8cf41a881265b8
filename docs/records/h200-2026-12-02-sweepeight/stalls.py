import csv,sys
f=sys.argv[1]
rows=list(csv.reader(open(f)))
hdr=rows[1]; data=rows[2:]
ix={h:i for i,h in enumerate(hdr)}
stalls=[h for h in hdr if h.startswith('stall_') and '(Not' not in h]
tot=sum(int(r[ix['Warp Stall Sampling (All Samples)']] or 0) for r in data)
print('total samples',tot, 'instructions', len(data))
for n,r in enumerate(data):
    s=int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    ex=int(r[ix['Instructions Executed']] or 0)
    top=sorted(((int(r[ix[h]] or 0),h[6:]) for h in stalls),reverse=True)[:3]
    tops=' '.join(f'{h}:{v}' for v,h in top if v>0)
    print(f"{n:4d} {s:6d} {100*s/tot:5.1f}% ex{ex:8d} {r[ix['Source']].strip()[:60]:60s} {tops}")
