#!/usr/bin/python3
"""An independent safetensors reader (json + numpy only) for tests/io/test_safetensors.cpp.

Reads FILE exactly as the format describes (8-byte little-endian header length N, N bytes of JSON,
then the data section that the tensors' data_offsets must cover exactly) and prints, tab-separated:

    meta    <key>    <value>
    tensor  <name>   <dtype>   <shape as JSON>   <sum as float64, repr>   <byte sum>   <first values as JSON>

The byte sum is the exact integer sum of the tensor's bytes (independent of summation order); the
first values (at most 4) are printed with repr, so the C++ side can compare them exactly. BF16 has no
numpy dtype: its 16 bits are the upper half of a float32. Exit status 1 with a message on a bad file.
"""
import json
import sys

import numpy as np

DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "BF16": None, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "F64": np.float64, "I64": np.int64, "U64": np.uint64,
}
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4,
         "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def fail(msg):
    print("read_safetensors.py: " + msg, file=sys.stderr)
    sys.exit(1)


def values(dtype, raw):
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view("<f4")
    return np.frombuffer(raw, dtype=np.dtype(DTYPES[dtype]).newbyteorder("<"))


def main(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file shorter than 8 bytes")
    n = int.from_bytes(blob[:8], "little")
    if n > len(blob) - 8:
        fail("header length %d exceeds the file" % n)
    header_text = blob[8:8 + n]
    if not header_text.startswith(b"{"):
        fail("header does not start with '{'")
    header = json.loads(header_text.decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    for key in sorted(metadata):
        print("meta\t%s\t%s" % (key, metadata[key]))
    covered = 0
    for name, info in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        dtype, shape = info["dtype"], info["shape"]
        begin, end = info["data_offsets"]
        if begin != covered:
            fail("tensor %s: data_offsets [%d, %d] do not start at %d" % (name, begin, end, covered))
        if end - begin != int(np.prod(shape, dtype=np.int64)) * SIZES[dtype]:
            fail("tensor %s: %d bytes do not match shape %s of %s" % (name, end - begin, shape, dtype))
        covered = end
        raw = data[begin:end]
        v = values(dtype, raw)
        total = float(np.sum(v.astype(np.float64), dtype=np.float64))
        byte_sum = int(np.frombuffer(raw, dtype=np.uint8).sum(dtype=np.uint64))
        first = [x.item() if dtype != "BOOL" else int(x) for x in v[:4]]
        first = [float(x) if isinstance(x, float) else x for x in first]
        print("tensor\t%s\t%s\t%s\t%r\t%d\t%s" % (name, dtype, json.dumps(shape), total, byte_sum,
                                                 json.dumps([repr(x) for x in first])))
    if covered != len(data):
        fail("data section is %d bytes, tensors cover %d" % (len(data), covered))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: read_safetensors.py FILE")
    main(sys.argv[1])
