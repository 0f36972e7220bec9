#!/usr/bin/env python3
"""The FP8 formats against an independent oracle: ml_dtypes' float8_e4m3fn.

Run by CTest as: test_formats.py <path to fp8proj_format_probe>.
- decode: all 256 codes decode to the same value as ml_dtypes (NaN codes to NaN).
- encode: over a million float32 inputs, including ties, subnormals, +-448, values just
  above 448, +-0 and NaN, our saturating encoder equals ml_dtypes applied to clip(x, -448, 448)
  (ml_dtypes itself maps out-of-range values to NaN; the hardware cvt.rn.satfinite, and we,
  saturate).
- UE8M0: the scale rule computed here in exact rational arithmetic (the smallest power of two
  >= fl32(max(amax, eps) / 448), exponent clamped to [1, 254]) equals ours bit for bit.
- fp32 ("float") scales: the library's weight (128x128) and activation (1x128) quantizers in
  ScaleMode::fp32 against numpy's IEEE float32 arithmetic and ml_dtypes: scale
  fl32(max(amax, eps) / 448), code e4m3(fl32(x / scale)), on fp32 inputs of many magnitudes,
  partial edge blocks, all-zero blocks (scale eps/448) and non-finite blocks (NaN scale, NaN codes).
"""
import subprocess
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np

PROBE = sys.argv[1]
E4M3 = ml_dtypes.float8_e4m3fn


def probe(mode, data=b""):
    return subprocess.run([PROBE, mode], input=data, capture_output=True, check=True).stdout


def test_decode():
    ours = np.frombuffer(probe("decode"), dtype=np.float32)
    ref = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan), "NaN codes differ"
    assert np.array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32)), "decoded values differ"
    print(f"decode: 256 codes identical ({nan.sum()} NaN codes)")


def encode_inputs(rng):
    grid = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)
    grid = np.unique(grid[np.isfinite(grid)])
    mids = (grid[:-1].astype(np.float64) + grid[1:]) / 2  # exact ties between neighbours
    ties = mids.astype(np.float32)
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    special = np.array([0.0, -0.0, 448.0, -448.0, 464.0, -464.0, 449.0, 480.0, 1e30, -1e30, np.inf, -np.inf, np.nan,
                        2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-6, 2.0**-7 * 0.999, 1e-45, -1e-45, 1e-38],
                       dtype=np.float32)
    special = np.concatenate([special, np.nextafter(np.float32(448), np.float32(1e9)) * np.array([1, -1], np.float32)])
    random_bits = rng.integers(0, 2**32, size=600_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    gaussian = (rng.standard_normal(300_000) * rng.choice([1e-3, 1.0, 100.0, 1e3], 300_000)).astype(np.float32)
    subnormal = (rng.uniform(-2.0**-6, 2.0**-6, 100_000)).astype(np.float32)
    return np.concatenate([grid, -grid, ties, -ties, near, special, random_bits, gaussian, subnormal])


def test_encode(rng):
    x = encode_inputs(rng)
    assert x.size >= 1_000_000
    ours = np.frombuffer(probe("encode", x.tobytes()), dtype=np.uint8)
    clipped = np.clip(x, -448.0, 448.0)  # NaN stays NaN; +-inf clip to +-448
    with np.errstate(invalid="ignore"):  # NaN inputs cast to the NaN code
        ref = clipped.astype(E4M3).view(np.uint8)
    nan = np.isnan(x)
    ours_val = ours.view(E4M3).astype(np.float32)
    assert np.all(np.isnan(ours_val[nan])), "NaN input must encode to NaN"
    bad = np.nonzero(ours[~nan] != ref[~nan])[0]
    if bad.size:
        i = bad[0]
        v = x[~nan][i]
        raise AssertionError(f"{bad.size} encodings differ; first: x={v!r} ({v.view(np.uint32):#010x}) "
                             f"ours={ours[~nan][i]:#04x} ml_dtypes={ref[~nan][i]:#04x}")
    print(f"encode: {x.size} inputs identical to ml_dtypes after saturation ({nan.sum()} NaN)")


def ue8m0_reference(amax, eps):
    a = max(float(amax), eps) if not np.isnan(amax) else eps
    q = Fraction(float(np.float32(np.float32(a) / np.float32(448.0))))  # the fp32 quotient, exactly
    e = 0
    while Fraction(2) ** e < q:
        e += 1
    while Fraction(2) ** (e - 1) >= q:
        e -= 1
    return min(max(e + 127, 1), 254)


def test_ue8m0(rng):
    amax = np.concatenate([
        np.array([0.0, 1e-45, 1e-40, 1e-12, 1e-10, 1e-4, 448.0, 896.0, 1.0, 3.4e38], dtype=np.float32),
        (np.float32(448) * np.float32(2.0) ** np.arange(-40, 40, dtype=np.float32)),  # exact powers times 448
        np.nextafter(np.float32(448) * np.float32(2.0) ** np.arange(-40, 40, dtype=np.float32), np.float32(np.inf)),
        np.abs(rng.standard_normal(20_000).astype(np.float32)) * rng.choice([1e-6, 1e-2, 1, 1e3], 20_000).astype(
            np.float32),
    ]).astype(np.float32)
    ours = np.frombuffer(probe("ue8m0", amax.tobytes()), dtype=np.uint8)
    n = amax.size
    for eps, got in ((1e-4, ours[:n]), (1e-10, ours[n:])):
        ref = np.array([ue8m0_reference(a, np.float32(eps)) for a in amax], dtype=np.uint8)
        assert np.array_equal(got, ref), f"UE8M0 differs for eps={eps} at amax={amax[np.argmax(got != ref)]!r}"
        scale = np.ldexp(1.0, got.astype(np.int64) - 127)
        assert np.all(np.maximum(amax.astype(np.float64), eps) / scale <= 448.0), "amax/scale exceeds 448"
    print(f"ue8m0: {n} amax values x 2 eps identical to the exact rule; amax/scale <= 448")


def fp32_rule(groups, eps):
    """(scales, codes) of the float rule for groups [..., G] of float32 values, in numpy float32."""
    finite = np.isfinite(groups).all(axis=-1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(groups), groups, 0)).max(axis=-1), 0).astype(np.float32)
    scale = (np.maximum(amax, np.float32(eps)) / np.float32(448.0)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = (groups / scale[..., None]).astype(np.float32)
        codes = np.clip(q, -448.0, 448.0).astype(E4M3).view(np.uint8)
    scale = np.where(finite, scale, np.float32(np.nan)).astype(np.float32)
    codes = np.where(finite[..., None], codes, np.uint8(0x7f))
    return scale, codes


def fp32_inputs(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    # A magnitude per row spanning 1e-9 .. 1e30, so that blocks and groups hit subnormal e4m3
    # codes, the eps clamp (amax < 1e-4 or 1e-10) and scales far from 1.
    x *= (10.0 ** rng.uniform(-9, 30, size=(shape[0], 1))).astype(np.float32)
    return x.astype(np.float32)


def test_fp32_weight(rng):
    n, k = 300, 520  # partial last blocks both ways: 3 x 5 blocks
    w = fp32_inputs(rng, (n, k))
    w[0:128, 0:128] = 0.0                        # all-zero block: scale eps / 448
    w[128:256, 128:256] *= np.float32(1e-7)      # amax below eps
    w[200, 300] = np.nan                          # block (1, 2) non-finite
    w[5, 515] = np.inf                            # block (0, 4) non-finite
    out = probe_tensor("fp32_weight", w)
    rb, cb = -(-n // 128), -(-k // 128)
    scales = np.frombuffer(out[:4 * rb * cb], dtype=np.float32).reshape(rb, cb)
    codes = np.frombuffer(out[4 * rb * cb:], dtype=np.uint8).reshape(n, k)
    for i in range(rb):
        for j in range(cb):
            blk = w[128 * i:128 * i + 128, 128 * j:128 * j + 128]
            s_ref, c_ref = fp32_rule(blk.reshape(1, -1), 1e-4)
            assert np.array_equal(scales[i, j:j + 1].view(np.uint32), s_ref.view(np.uint32)) or (
                np.isnan(scales[i, j]) and np.isnan(s_ref[0])), f"block ({i},{j}) scale {scales[i, j]!r} vs {s_ref[0]!r}"
            got = codes[128 * i:128 * i + 128, 128 * j:128 * j + 128].reshape(-1)
            bad = np.nonzero(got != c_ref[0])[0]
            assert bad.size == 0, f"block ({i},{j}): {bad.size} codes differ, first {got[bad[0]]:#04x} vs " \
                                  f"{c_ref[0][bad[0]]:#04x} for {blk.reshape(-1)[bad[0]]!r}"
    assert np.isnan(scales[1, 2]) and np.isnan(scales[0, 4]) and scales[0, 0] == np.float32(1e-4) / np.float32(448)
    print(f"fp32 weight scales: {n}x{k}, {rb * cb} blocks identical to numpy float32 + ml_dtypes")


def test_fp32_activation(rng):
    m, k = 203, 1024
    x = fp32_inputs(rng, (m, k))
    x[7, :] = 0.0
    x[9, 130] = np.nan
    out = probe_tensor("fp32_act", x)
    ld = -(-m // 4) * 4
    scales = np.frombuffer(out[:4 * (k // 128) * ld], dtype=np.float32).reshape(k // 128, ld)
    codes = np.frombuffer(out[4 * (k // 128) * ld:], dtype=np.uint8).reshape(m, k)
    s_ref, c_ref = fp32_rule(x.reshape(m, k // 128, 128), 1e-10)
    got = scales[:, :m].T
    assert np.array_equal(np.isnan(got), np.isnan(s_ref)), "NaN scales differ"
    fin = ~np.isnan(s_ref)
    assert np.array_equal(got[fin].view(np.uint32), s_ref[fin].view(np.uint32)), "activation scales differ"
    bad = np.nonzero(codes != c_ref.reshape(m, k))
    assert bad[0].size == 0, f"{bad[0].size} activation codes differ"
    print(f"fp32 activation scales: {m}x{k}, {m * k // 128} groups identical to numpy float32 + ml_dtypes")


def probe_tensor(mode, t):
    return subprocess.run([PROBE, mode, str(t.shape[0]), str(t.shape[1])], input=t.astype(np.float32).tobytes(),
                          capture_output=True, check=True).stdout


if __name__ == "__main__":
    rng = np.random.default_rng(20261130)
    test_decode()
    test_encode(rng)
    test_ue8m0(rng)
    test_fp32_weight(rng)
    test_fp32_activation(rng)
    print("formats: all oracle checks passed")
