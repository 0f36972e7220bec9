#!/usr/bin/env python3
"""Differential test of fp8proj's safetensors parser against the reference (Hugging Face's
`safetensors` package, its Rust parser): a few thousand mutated files from a fixed seed.

Usage: test_safetensors_differential.py PROBE [--count N] [--seed S] [--keep DIR]
PROBE is tests/oracle/safetensors_probe.cpp's binary. For every file:
  * both accept: names, dtypes, shapes and bytes must be identical;
  * the reference accepts, fp8proj rejects: allowed only for fp8proj's documented stricter
    rule (a key twice in one object: the reference keeps one silently; docs/robustness.md);
  * fp8proj accepts, the reference rejects: a failure.
Prints the counts; exits 1 on any disagreement outside that rule.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import safetensors
from safetensors.numpy import save

FNV_OFFSET, FNV_PRIME, MASK = 1469598103934665603, 1099511628211, (1 << 64) - 1
STRICTER = ("appears twice",)


def fnv(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def base_files():
    rng = np.random.default_rng(0)
    yield save({"w": rng.standard_normal((3, 4)).astype(np.float32)})
    yield save({"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.ones((2,), np.float64),
                "empty": np.zeros((0, 3), np.float32)}, metadata={"format": "pt"})
    yield save({"x.weight": rng.integers(0, 255, (4, 8), dtype=np.uint8), "x.bias": np.zeros((1,), np.int64)})
    yield save({"s": np.array(7, dtype=np.int32)})


def split(blob: bytes):
    n = struct.unpack("<Q", blob[:8])[0]
    return blob[8:8 + n], blob[8 + n:]


def join(header: bytes, data: bytes, length=None):
    return struct.pack("<Q", (len(header) if length is None else length) % (1 << 64)) + header + data


WEIRD_VALUES = [-1, 0, 1, 2**63 - 1, 2**63, 2**64, 2**64 + 1, 1.5, 1e300, -0.0, True, False, None, "3",
                [], {}, [[1]], [1, 2, 3], "F32", "BF16", "F8_E4M3", "U64", "nope"]


def mutate_json(header: bytes, rng: random.Random):
    try:
        h = json.loads(header)
    except Exception:
        return None
    names = [k for k in h if k != "__metadata__"]
    op = rng.randrange(10)
    if op == 0 and names:  # a field of an entry gets a weird value
        e = h[rng.choice(names)]
        e[rng.choice(["dtype", "shape", "data_offsets"])] = rng.choice(WEIRD_VALUES)
    elif op == 1 and names:  # one element of shape / data_offsets
        e = h[rng.choice(names)]
        f = rng.choice(["shape", "data_offsets"])
        if isinstance(e.get(f), list) and e[f]:
            e[f][rng.randrange(len(e[f]))] = rng.choice(WEIRD_VALUES)
    elif op == 2 and names:  # remove a field, or a whole entry
        e = h[rng.choice(names)]
        if rng.random() < 0.5:
            e.pop(rng.choice(["dtype", "shape", "data_offsets"]), None)
        else:
            h.pop(rng.choice(names))
    elif op == 3:
        h["__metadata__"] = rng.choice([None, {}, {"k": "v"}, {"k": 1}, [], "x", {"k": None}])
    elif op == 4 and names:  # an extra field (the reference ignores unknown fields)
        h[rng.choice(names)]["extra"] = rng.choice(WEIRD_VALUES)
    elif op == 5 and names:  # offsets shifted by a little
        e = h[rng.choice(names)]
        if isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2:
            i = rng.randrange(2)
            if isinstance(e["data_offsets"][i], int):
                e["data_offsets"][i] += rng.choice([-2, -1, 1, 2, 8])
    elif op == 6 and names:  # a renamed or unicode tensor name
        k = rng.choice(names)
        h[rng.choice(["", " ", "é", "a\u0000b", k + "x", "__metadata_"])] = h.pop(k)
    elif op == 7 and names:  # a shape of another length
        e = h[rng.choice(names)]
        if isinstance(e.get("shape"), list):
            e["shape"] = e["shape"] + [1] if rng.random() < 0.5 else e["shape"][:-1]
    elif op == 8:
        h = rng.choice([[], "x", 1, None, [h]])
    text = json.dumps(h, ensure_ascii=rng.random() < 0.5)
    if op == 9 and names:  # a duplicate key, written by hand
        k = rng.choice(names)
        text = "{" + json.dumps(k) + ": " + json.dumps(h[k]) + ", " + text[1:]
    return text.encode()


def mutate_bytes(header: bytes, data: bytes, rng: random.Random):
    op = rng.randrange(9)
    hb = bytearray(header)
    if op == 0 and hb:  # flip a byte of the header
        hb[rng.randrange(len(hb))] = rng.randrange(256)
    elif op == 1:  # insert a byte (NUL, whitespace, control, UTF-8 lead, quote...)
        hb.insert(rng.randrange(len(hb) + 1), rng.choice([0, 9, 10, 13, 32, 1, 0x7f, 0xc3, 0xff, 0x22, 0x5c, 0x7b]))
    elif op == 2 and hb:  # delete a byte
        del hb[rng.randrange(len(hb))]
    elif op == 3:  # leading / trailing whitespace
        ws = bytes(rng.choice(b" \t\n\r") for _ in range(rng.randrange(1, 9)))
        hb = bytearray(ws + bytes(hb)) if rng.random() < 0.5 else bytearray(bytes(hb) + ws)
    elif op == 4:  # header length off by a little
        return join(bytes(hb), data, len(hb) + rng.choice([-8, -1, 1, 8, 1 << 40]))
    elif op == 5:  # data truncated or extended
        data = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.5 else data + b"\0" * rng.randrange(1, 9)
    elif op == 6:  # deep nesting
        d = rng.choice([10, 127, 128, 129, 200, 5000])
        hb = bytearray(bytes(hb[:-1]) + b', "deep": ' + b"[" * d + b"]" * d + b"}")
    elif op == 7:  # a NUL byte and more JSON after the object
        hb = bytearray(bytes(hb) + b"\0" + rng.choice([b"", b"junk", b', "x": 1}']))
    elif op == 8:  # the file cut anywhere
        blob = join(bytes(hb), data)
        return blob[: rng.randrange(len(blob) + 1)]
    return join(bytes(hb), data)


def reference(blob: bytes):
    try:
        out = safetensors.deserialize(blob)
    except Exception as e:  # SafetensorError, and a few others on malformed input
        return ("err", str(e).splitlines()[0] if str(e) else type(e).__name__)
    items = {}
    for name, t in out:
        shape = ",".join(str(d) for d in t["shape"])
        items[name.encode().hex()] = f'{t["dtype"]}:[{shape}]:{fnv(bytes(t["data"]))}'
    return ("ok", items)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("probe")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--keep", help="folder to keep the disagreeing files in")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    bases = list(base_files())
    counts = {"files": 0, "both reject": 0, "both accept, identical": 0, "both accept, different": 0,
              "fp8proj rejects, stricter rule": 0, "fp8proj rejects, reference accepts": 0,
              "fp8proj accepts, reference rejects": 0}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        blobs = []
        for i in range(args.count):
            header, data = split(rng.choice(bases))
            if rng.random() < 0.5:
                text = mutate_json(header, rng)
                blob = join(text, data) if text is not None else mutate_bytes(header, data, rng)
                if rng.random() < 0.3:
                    h2, d2 = split(blob) if len(blob) >= 8 and struct.unpack("<Q", blob[:8])[0] <= len(blob) - 8 else (blob[8:], b"")
                    blob = mutate_bytes(h2, d2, rng)
            else:
                blob = mutate_bytes(header, data, rng)
            path = os.path.join(tmp, f"m{i:05d}.safetensors")
            with open(path, "wb") as f:
                f.write(blob)
            blobs.append((path, blob))
        proc = subprocess.run([args.probe], input="\n".join(p for p, _ in blobs) + "\n", capture_output=True,
                              text=True, errors="replace", timeout=600)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-4000:])
            print(f"FAIL: the probe exited with {proc.returncode} (a crash is a finding)")
            return 1
        lines = proc.stdout.splitlines()
        if len(lines) != len(blobs):
            print(f"FAIL: {len(lines)} answers for {len(blobs)} files")
            return 1
        for (path, blob), line in zip(blobs, lines):
            counts["files"] += 1
            ours_ok = line.startswith("ok ")
            ref = reference(blob)
            if ours_ok:
                parts = line.split(" ")[2:]
                ours = dict(p.split(":", 1) for p in parts)
            if ref[0] == "err" and not ours_ok:
                counts["both reject"] += 1
            elif ref[0] == "ok" and ours_ok:
                same = ours == ref[1]
                counts["both accept, identical" if same else "both accept, different"] += 1
                if not same:
                    failures.append((path, blob, f"different content: ours {ours} reference {ref[1]}"))
            elif ref[0] == "ok":
                if any(s in line for s in STRICTER):
                    counts["fp8proj rejects, stricter rule"] += 1
                else:
                    counts["fp8proj rejects, reference accepts"] += 1
                    failures.append((path, blob, "reference accepts; fp8proj: " + line[4:]))
            else:
                counts["fp8proj accepts, reference rejects"] += 1
                failures.append((path, blob, "fp8proj accepts; reference: " + ref[1]))
        if args.keep and failures:
            os.makedirs(args.keep, exist_ok=True)
            for path, blob, _ in failures:
                with open(os.path.join(args.keep, os.path.basename(path)), "wb") as f:
                    f.write(blob)
    width = max(len(k) for k in counts)
    for k, v in counts.items():
        print(f"{k:<{width}}  {v}")
    for path, blob, why in failures[:20]:
        print(f"DISAGREE {os.path.basename(path)}: {why[:300]}\n  header: {blob[8:208]!r}")
    print("PASS" if not failures else f"FAIL: {len(failures)} disagreements")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
