"""CUDA source of the reduction kernels, and how to launch them (pure Python, no CuPy).

``dst[i] = dst[i] (op) src[i]`` is the whole job of a reduction kernel: memory-bound, so
what matters is moving bytes at full width. For float32, float64, int32 and int64 the
kernel is a ``RawKernel`` generated here: each thread walks a grid-stride loop over 16-byte
vectors (``float4``, ``double2``, ``int4``, ``longlong2``), with scalar loops for the head
(elements before the first 16-byte boundary) and the tail. The vector body is used only
when ``dst`` and ``src`` are equally misaligned, so one head length aligns both; otherwise
the whole range takes the scalar loop. ``launch_plan`` computes that from the pointers.

float16 and bfloat16 use CuPy's ``ElementwiseKernel`` with CuPy's own half types
(``EW_OPS``), whose arithmetic goes through float exactly as NumPy's and ml_dtypes' do.

min/max propagate NaN like ``numpy.minimum``/``numpy.maximum``: ``dst`` is kept when it
is NaN, else ``src`` is taken when it is NaN or strictly better. Integer sums and products
wrap (two's complement), as NumPy's do.
"""

from __future__ import annotations

from typing import NamedTuple

#: dtype -> (C type, 16-byte vector type, lanes per vector, item size)
RAW_TYPES: dict[str, tuple[str, str, int, int]] = {
    "float32": ("float", "float4", 4, 4),
    "float64": ("double", "double2", 2, 8),
    "int32": ("int", "int4", 4, 4),
    "int64": ("long long", "longlong2", 2, 8),
}

#: Ops of the reduction kernels (``avg`` is ``sum`` then ``divide``).
KERNEL_OPS: tuple[str, ...] = ("sum", "prod", "min", "max")

# C expressions of ``a (op) b`` where a is dst and b is src.
_EXPR = {
    "sum": "a + b",
    "prod": "a * b",
    "min": "(b < a || b != b) && !(a != a) ? b : a",
    "max": "(b > a || b != b) && !(a != a) ? b : a",
}

#: ElementwiseKernel bodies for float16/bfloat16 (``x`` = src, ``y`` = dst, in place).
#: CuPy's half classes convert to float for arithmetic and comparisons and round back on
#: assignment.
EW_OPS: dict[str, str] = {
    "sum": "y = y + x",
    "prod": "y = y * x",
    "min": "y = ((x < y || x != x) && !(y != y)) ? x : y",
    "max": "y = ((x > y || x != x) && !(y != y)) ? x : y",
}

#: ElementwiseKernel types of the half-precision dtypes.
EW_DTYPES: tuple[str, ...] = ("float16", "bfloat16")

#: Threads per block of the raw kernels.
BLOCK = 256
#: 16 bytes: the width of one vector load.
VEC_BYTES = 16


def kernel_name(dtype: str, op: str) -> str:
    return f"ringtune_{op}_{dtype}"


def reduce_source(dtype: str, op: str) -> str:
    """Self-contained CUDA C++ (no #include) of the raw reduction kernel for (dtype, op).

    Signature: ``(T* dst, const T* src, long long n, long long head, int vec)``. With
    ``vec`` = 0 all n elements take the scalar loop; with ``vec`` = 1 elements [0, head)
    and the tail take it and the rest is read and written as 16-byte vectors (the caller
    guarantees ``dst + head`` and ``src + head`` are 16-byte aligned)."""
    if dtype not in RAW_TYPES:
        raise TypeError(f"no raw reduction kernel for dtype {dtype}: use one of "
                        f"{', '.join(RAW_TYPES)} (float16/bfloat16 use EW_OPS)")
    if op not in _EXPR:
        raise ValueError(f"no reduction kernel for op {op!r}: use one of "
                         f"{', '.join(KERNEL_OPS)}")
    ctype, vtype, lanes, _ = RAW_TYPES[dtype]
    fields = "xyzw"[:lanes]
    body = "\n".join(f"            v.{f} = rt_op(v.{f}, w.{f});" for f in fields)
    name = kernel_name(dtype, op)
    return f"""// ringtune: dst = dst ({op}) src for {dtype} (collectives/cuda/kernels.py)
typedef {ctype} rt_t;
typedef {vtype} rt_v;
static __device__ __forceinline__ rt_t rt_op(rt_t a, rt_t b) {{ return {_EXPR[op]}; }}
extern "C" __global__ void {name}(rt_t* __restrict__ dst, const rt_t* __restrict__ src,
                                  const long long n, const long long head, const int vec)
{{
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long tail = 0;
    if (vec) {{
        for (long long i = start; i < head; i += stride) {{
            dst[i] = rt_op(dst[i], src[i]);
        }}
        const long long nv = (n - head) / {lanes};
        rt_v* __restrict__ dv = reinterpret_cast<rt_v*>(dst + head);
        const rt_v* __restrict__ sv = reinterpret_cast<const rt_v*>(src + head);
        for (long long i = start; i < nv; i += stride) {{
            rt_v v = dv[i];
            const rt_v w = sv[i];
{body}
            dv[i] = v;
        }}
        tail = head + nv * {lanes};
    }}
    for (long long i = tail + start; i < n; i += stride) {{
        dst[i] = rt_op(dst[i], src[i]);
    }}
}}
"""


class Launch(NamedTuple):
    """Arguments of one raw-kernel launch beyond the two pointers."""

    grid: int
    head: int
    vec: int


def launch_plan(dst_ptr: int, src_ptr: int, n: int, itemsize: int, max_blocks: int) -> Launch:
    """Grid size and the (head, vec) arguments for ``n`` elements at these addresses.

    Vectors are used when both pointers are item-aligned and equally far from a 16-byte
    boundary (then ``head`` elements bring both to it) and at least one whole vector
    remains. The grid covers the work once, capped at ``max_blocks`` (the grid-stride loops
    take the rest), so small chunks launch few blocks and big buffers do not launch
    millions."""
    if n <= 0:
        return Launch(0, 0, 0)
    lanes = VEC_BYTES // itemsize
    mis_d, mis_s = dst_ptr % VEC_BYTES, src_ptr % VEC_BYTES
    vec = 0
    head = 0
    if mis_d == mis_s and mis_d % itemsize == 0:
        head = ((VEC_BYTES - mis_d) % VEC_BYTES) // itemsize
        if n - head >= lanes:
            vec = 1
        else:
            head = 0
    # Each loop is grid-stride; the vector body is the long one.
    work = (n - head) // lanes if vec else n
    grid = max(1, min(max_blocks, -(-work // BLOCK)))
    return Launch(grid, head, vec)
