"""Writes mamba3_reference.json: one chunk of the Mamba-3 layer (SISO and MIMO R = 2) run
forward and backward by the float64 numpy oracle of the design notes (MATH.md section 10,
reference/mamba3.py), for test_mamba3_reference.cpp. The build and the tests only read the
JSON; this script is how it was made:

    /usr/bin/python3 make_reference_fixture.py /work/shared/design/reference > mamba3_reference.json
"""
import json
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import mamba3 as ref  # noqa: E402


def case(rng, R):
    p, dims = ref.init(rng, Dm=6, H=2, P=3, N=8, R=R, NA=2)
    T, Cs = 12, 5
    u = rng.standard_normal((T, dims['Dm']))
    bd0 = ref.rand_bd(dims, rng)
    dout = rng.standard_normal((T, dims['Dm']))
    dbd_T = ref.rand_bd(dims, rng)
    out, bdT, cache = ref.layer_fwd(u, bd0, p, dims, Cs)
    du, dbd0, g = ref.layer_bwd(dout, dbd_T, p, dims, cache)
    flat = lambda d: {k: np.asarray(v).ravel().tolist() for k, v in d.items()}
    return dict(dims=dict(dims, T=T, block=Cs), params=flat(p), u=u.ravel().tolist(), bd0=flat(bd0),
                dout=dout.ravel().tolist(), dbd_T=flat(dbd_T), out=out.ravel().tolist(), bd_T=flat(bdT),
                du=du.ravel().tolist(), dbd0=flat(dbd0), grads=flat(g))


rng = np.random.default_rng(20261201)
json.dump({'siso': case(rng, 1), 'mimo': case(rng, 2)}, sys.stdout)
