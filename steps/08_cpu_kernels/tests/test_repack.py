"""The int4 kernel's contract in torch 2.13 (ATen's LinearAlgebra.cpp and cpu/int4mm_kernel.cpp), and the repack for
every kernel (ATen's, and this step's torchtpu_dot4_mm and torchtpu_fma4_mm): the checkpoint's nibbles in the
kernel's layout, equal to what compressed-tensors decompresses."""
import json

import pytest
import torch
import torchtpu_kernels
from safetensors import safe_open
from torchtpu_rs import checkpoints

convert = torch.ops.aten._convert_weight_to_int4pack_for_cpu
mm = torch.ops.aten._weight_int4pack_mm_for_cpu


def scale_zeros(scale, dtype=torch.bfloat16):
    s = scale.t().to(dtype)
    return torch.stack([s, torch.zeros_like(s)], -1).contiguous()


def random_nibbles(n, k, seed=0):
    return torch.randint(0, 16, (n, k), dtype=torch.int32, generator=torch.Generator().manual_seed(seed))


def words(nibbles):
    """int32 words of eight nibbles, low first: compressed-tensors' weight_packed."""
    q = nibbles.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous().view(torch.int32)


# --8<-- [start:contract]
def test_the_kernel_contract_in_torch_2_13():
    n, k = 64, 256
    packed = convert(random_nibbles(n, k), 1)
    assert (packed.dtype, packed.shape) == (torch.uint8, (n, k // 2))  # two nibbles a byte
    x = torch.randn(3, k, dtype=torch.bfloat16)
    scale = torch.full((n, k // 32), 0.01)
    for group in (32, 64, 128, 256):  # the group sizes it takes
        assert mm(x, packed, group, scale_zeros(scale[:, : k // group])).shape == (3, n)
    for group in (16, 48, 512):
        with pytest.raises(RuntimeError, match="expect qGroupSize to be 32, 64, 128 or 256"):
            mm(x, packed, group, scale_zeros(scale))
    with pytest.raises(RuntimeError, match="expect K to be divisible by qGroupSize"):
        mm(torch.randn(3, 96, dtype=torch.bfloat16), convert(random_nibbles(n, 96), 1), 64, scale_zeros(scale[:, :2]))
    with pytest.raises(RuntimeError, match="expect N to be dividable by 16"):
        convert(random_nibbles(40, k), 1)
    with pytest.raises(RuntimeError, match="expect K to be dividable by 2"):
        convert(random_nibbles(16, 33), 1)
    with pytest.raises(RuntimeError, match="expect weight to be kInt"):
        convert(random_nibbles(16, 64).long(), 1)
    # activations: 2-D, contiguous, bf16 / f16 / f32; scales and zeros are read in the activations' dtype
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert mm(x.to(dtype), packed, 32, scale_zeros(scale, dtype)).dtype == dtype
    with pytest.raises(RuntimeError, match="expected scalar type BFloat16 but found Half"):
        mm(x, packed, 32, scale_zeros(scale, torch.float16))
    with pytest.raises(RuntimeError, match="expect A to be either 32-bit or 16-bit float"):
        mm(x.to(torch.int32), packed, 32, scale_zeros(scale))
    with pytest.raises(RuntimeError, match="expect A to be contiguous"):
        mm(torch.randn(k, 3, dtype=torch.bfloat16).t(), packed, 32, scale_zeros(scale))
    with pytest.raises(RuntimeError, match="expect A to be 2D"):
        mm(x.unsqueeze(0), packed, 32, scale_zeros(scale))
    with pytest.raises(RuntimeError, match="expect B to be uint8"):
        mm(x, packed.to(torch.int32), 32, scale_zeros(scale))
    with pytest.raises(RuntimeError, match="expect B.size\\(1\\) to be K/2"):
        mm(x, packed[:, :64].contiguous(), 32, scale_zeros(scale))
    with pytest.raises(RuntimeError, match="expect qScaleAndZeros to be 3d tensor with sizes"):
        mm(x, packed, 32, scale_zeros(scale)[:, :32])
    # ATen does not check the scales' first size nor their layout: the engine makes them itself, contiguous
    _, sz = torchtpu_kernels.repack(words(random_nibbles(n, k)), scale.to(torch.bfloat16), k)
    assert sz.shape == (k // 32, n, 2) and sz.is_contiguous() and sz.dtype == torch.bfloat16


def test_the_output_head_fits():
    """N = 262,144 rows (E2B's head) is allowed: the kernel indexes with int, and 262144 × 1536 < 2^31."""
    n, k = 262144, 64
    nibbles = (torch.arange(n * k, dtype=torch.int32) % 16).view(n, k)
    scale = torch.full((n, k // 32), 0.5, dtype=torch.bfloat16)
    want = ((nibbles - 8).float() * 0.5).sum(1)
    for matmul in ("aten", *(["dot4"] if torchtpu_kernels.dot4_runs() else []),
                   *(["fma4"] if torchtpu_kernels.fma4_runs() else [])):
        y = torchtpu_kernels.Int4Linear(words(nibbles), scale, k, matmul=matmul)(torch.ones(1, k, dtype=torch.bfloat16))
        assert y.shape == (1, n) and torch.equal(y[0].float(), want), matmul
# --8<-- [end:contract]


def test_row_blocks_are_the_whole_repack():
    """The engine repacks 1,024 rows at a time; blocks of a multiple of the kernel's 64-row block give the whole's
    bytes, here with a remainder of 48 rows."""
    n, k = 2 * 1024 + 48, 96
    nibbles = random_nibbles(n, k, seed=1)
    packed, _ = torchtpu_kernels.repack(words(nibbles), torch.ones(n, k // 32, dtype=torch.bfloat16), k)
    assert torch.equal(packed, convert(nibbles, 1))


def packed_matrices(folder):
    """(name, weight_packed, weight_scale, weight_shape) of every packed matrix in a checkpoint folder."""
    out = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                if key.endswith(".weight_packed"):
                    p = key.removesuffix(".weight_packed")
                    out.append((p, *(f.get_tensor(f"{p}.weight_{s}") for s in ("packed", "scale", "shape"))))
    return out


def decompress(folder, packed, scale, shape):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    groups = json.loads((folder / "config.json").read_text())["quantization_config"]["config_groups"]
    scheme = QuantizationScheme.model_validate(next(iter(groups.values())))
    return PackedQuantizationCompressor.decompress(
        {"weight_packed": packed, "weight_scale": scale, "weight_shape": shape}, scheme)["weight"]


def through_kernel(packed, scale, cols, dtype, matmul="aten"):
    """W itself out of the int4 path: identity activations give y[k, n] = W[n, k], one product each, exact in
    float32 and rounded once to the activation dtype."""
    return torchtpu_kernels.Int4Linear(packed, scale, cols, dtype=str(dtype).removeprefix("torch."),
                                    matmul=matmul)(torch.eye(cols, dtype=dtype)).t()


def exact_weight(packed, scale, cols):
    """(q - 8) · scale in float64, unrounded: what both kernels multiply by."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    q = ((packed.unsqueeze(-1) >> shifts) & 0xF).flatten(-2)[:, :cols] - 8
    return q.double() * scale.double().repeat_interleave(cols // scale.shape[1], 1)


# --8<-- [start:repack_test]
@pytest.mark.parametrize("layout", checkpoints.LAYOUTS)
@pytest.mark.parametrize("twin", ["text", "emb4"])
def test_repack_is_what_compressed_tensors_decompresses(layout, twin, matmul):
    """Every packed matrix of the tiny checkpoints (each linear shape, the emb4 tables and untied head): through
    the int4 kernel, W is compressed-tensors' dequantization bit for bit. bf16 scales in bf16. The twin's F16
    scales: ATen's kernel reads them in the activation dtype, so in float32 (exact), rounded to f16 as
    compressed-tensors rounds; dot4 and fma4 read them as float32 whatever the activations, so their bf16 W is the exact
    (q - 8) · scale rounded once to bf16."""
    folder = checkpoints.tiny(layout) / twin
    seen = set()
    for name, packed, scale, shape in packed_matrices(folder):
        want = decompress(folder, packed, scale, shape)
        cols = int(shape[1])
        if scale.dtype == torch.bfloat16:
            got = through_kernel(packed, scale, cols, torch.bfloat16, matmul)
        elif matmul == "aten":
            got = through_kernel(packed, scale, cols, torch.float32).to(scale.dtype)
        else:
            got = through_kernel(packed, scale, cols, torch.bfloat16, matmul)
            want = exact_weight(packed, scale, cols).to(torch.bfloat16)
        assert got.dtype == want.dtype and torch.equal(got, want), name
        seen.add(tuple(shape.tolist()))
    assert len(seen) >= 6  # q/k/v/o, the double-wide MLP, the per-layer projections, ...


def test_repack_of_an_e2b_shape(matmul):
    """One E2B linear, q_proj [2048, 1536], packed with the project's compressed-tensors-equal packer."""
    w = torch.randn(2048, 1536, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16) * 0.02
    p = checkpoints.pack_w4(w)
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=32))
    want = PackedQuantizationCompressor.decompress(dict(p), scheme)["weight"]
    got = through_kernel(p["weight_packed"], p["weight_scale"], 1536, torch.bfloat16, matmul)
    assert torch.equal(got, want)
# --8<-- [end:repack_test]


# --8<-- [start:why]
def rounded_once(y, exact):
    """y is `exact` (float64) rounded once to bf16, but for float32 summation order: at most 1% of the entries one
    bf16 step off."""
    want = exact.to(torch.bfloat16)
    off = y != want
    step = (want.float().abs() * 2.0 ** -7).clamp(min=2.0 ** -126)
    return off.float().mean().item() <= 0.01 and bool(((y.float() - want.float()).abs() <= step)[off].all())


def test_the_kernel_multiplies_by_q_times_scale_unrounded(matmul):
    """Why int4 is not bit-identical to the bf16 path: compressed-tensors' weight is q · s rounded to bf16 (about a
    third of them change), the kernel's is q · s exact in float32. Each path is its own product rounded once; with
    scales that make q · s exact in bf16 (powers of two) the two paths agree (but for summation order)."""
    n, k = 256, 512
    nibbles = random_nibbles(n, k, seed=3)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    q = (nibbles - 8).view(n, k // 32, 32)
    exponents = torch.randint(-9, -4, (n, k // 32), generator=torch.Generator().manual_seed(5))
    for scale, rounded in ((torch.rand(n, k // 32, generator=torch.Generator().manual_seed(6)) * 0.01 + 1e-3, True),
                           (2.0 ** exponents, False)):
        scale = scale.to(torch.bfloat16)
        ct = (q.to(torch.bfloat16) * scale.unsqueeze(-1)).view(n, k)  # what compressed-tensors decompresses
        exact = (q.double() * scale.double().unsqueeze(-1)).view(n, k)
        assert bool((ct.double() != exact).any()) == rounded
        y = torchtpu_kernels.Int4Linear(words(nibbles), scale, k, matmul=matmul)(x)
        assert rounded_once(y, x.double() @ exact.t())  # the exact product
        dense = torch.nn.functional.linear(x, ct)  # step 03's path: the product with rounded weights
        assert rounded_once(dense, x.double() @ ct.double().t())
        agree = (y == dense).float().mean().item()
        assert (agree < 0.9) if rounded else (agree > 0.99), agree
# --8<-- [end:why]


@pytest.mark.parametrize("rows, cols, groups, words_, why", [
    (40, 64, 2, 8, "40 rows: the kernels' layouts need a multiple of 16"),
    (32, 64, 4, 8, "group_size 16: the int4 kernels take groups of 32, 64, 128 or 256"),
    (32, 96, 2, 12, "group_size 48"),
    (32, 1024, 2, 128, "group_size 512"),
])
def test_shapes_the_kernel_refuses_are_named(rows, cols, groups, words_, why):
    packed = torch.zeros(rows, words_, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=why):
        torchtpu_kernels.repack(packed, torch.ones(rows, groups, dtype=torch.bfloat16), cols)


def test_malformed_matrices_are_refused():
    with pytest.raises(ValueError, match="weight_packed: .* need int32"):
        torchtpu_kernels.repack(torch.zeros(32, 8, dtype=torch.int64), torch.ones(32, 2, dtype=torch.bfloat16), 64)
    with pytest.raises(ValueError, match="weight_scale: .* need bf16 or f16"):
        torchtpu_kernels.repack(torch.zeros(32, 8, dtype=torch.int32), torch.ones(32, 2), 64)
    with pytest.raises(ValueError, match="weight_scale"):
        torchtpu_kernels.repack(torch.zeros(32, 8, dtype=torch.int32), torch.ones(32, 3, dtype=torch.bfloat16), 64)
    with pytest.raises(TypeError, match="weight_packed: expected a torch.Tensor"):
        torchtpu_kernels.repack([1, 2], torch.ones(32, 2, dtype=torch.bfloat16), 64)
    for cols in (0, -64, 2**63 - 1):  # the last, rounded up to whole words, would pass i64's top
        with pytest.raises(ValueError, match=f"cols={cols}: need 1 <= cols|weight_packed: .* need int32"):
            torchtpu_kernels.repack(torch.zeros(32, 8, dtype=torch.int32), torch.ones(32, 2, dtype=torch.bfloat16),
                                    cols)
    zeros, ones = torch.zeros(32, 8, dtype=torch.int32), torch.ones(32, 2, dtype=torch.bfloat16)
    linear = torchtpu_kernels.Int4Linear(zeros, ones, 64)
    with pytest.raises(ValueError, match="x: shape"):
        linear(torch.ones(2, 32, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x: Float, need BFloat16"):
        linear(torch.ones(2, 64))
    auto = torchtpu_kernels.Int4Linear(zeros, ones, 64, matmul="auto")  # as the Engine's int4_matmul="auto"
    want = "dot4" if torchtpu_kernels.dot4_runs() else "fma4" if torchtpu_kernels.fma4_runs() else "aten"
    assert auto.matmul == want and linear.matmul == "aten"
    with pytest.raises(ValueError, match="int4_matmul=\"fast\""):
        torchtpu_kernels.Int4Linear(torch.zeros(32, 8, dtype=torch.int32), torch.ones(32, 2, dtype=torch.bfloat16), 64,
                                 matmul="fast")


def test_this_steps_kernels_take_bfloat16_activations_only(own):
    with pytest.raises(NotImplementedError, match=f"torchtpu_{own}_mm takes bfloat16 activations only"):
        torchtpu_kernels.Int4Linear(torch.zeros(32, 8, dtype=torch.int32), torch.ones(32, 2, dtype=torch.bfloat16), 64,
                                 dtype="float32", matmul=own)


def test_this_steps_kernels_agree_with_atens_on_an_e2b_matvec(own):
    """[6144 × 1536], a decode step's row and a 5-row chunk: the same exact product, each rounded once but for
    float32 summation order, so nearly every output is the same bf16 number."""
    n, k = 6144, 1536
    packed = words(random_nibbles(n, k, seed=7))
    scale = (torch.rand(n, k // 32, generator=torch.Generator().manual_seed(8)) * 0.01 + 1e-3).to(torch.bfloat16)
    aten, ours = (torchtpu_kernels.Int4Linear(packed, scale, k, matmul=m) for m in ("aten", own))
    # ours: a bf16 scale per group of 32, as stored; ATen's: a bf16 scale and a bf16 zero
    assert (ours.nbytes, aten.nbytes) == (n * k // 2 + n * (k // 32) * 2, n * k // 2 + n * (k // 32) * 4)
    for rows in (1, 5):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        exact = x.double() @ exact_weight(packed, scale, k).t()
        ya, yo = aten(x), ours(x)
        assert rounded_once(ya, exact)
        # dot4 sums 128 + nibble over each group and takes 136 · Σx off after (fma4 the nibble, less 8 · Σx): where
        # an output's terms cancel to almost nothing, a float32 rounding of those sums (2^-24 of 136 · Σ|x|) is a
        # few bf16 steps of it
        want, reach = exact.to(torch.bfloat16), 136 * 2.0 ** -19 * (x.double().abs().view(rows, -1, 32).sum(-1)
                                                                     @ scale.double().t())
        assert (yo != want).float().mean().item() <= 0.01
        assert bool(((yo.double() - exact).abs() <= want.double().abs() * 2.0 ** -7 + reach).all())
        assert (ya == yo).float().mean().item() > 0.99


def test_this_steps_kernels_give_the_same_bits_on_one_thread_and_two(matmul):
    """Each thread of a kernel takes whole blocks of rows (and every row of x for a block), so how many threads
    torch lends it changes who computes an output, never how: the same bits. (make test's copies run one thread
    each; this checks the two-thread split.)"""
    n, k = 1024 + 48, 192
    packed = words(random_nibbles(n, k, seed=9))
    scale = (torch.rand(n, k // 32, generator=torch.Generator().manual_seed(10)) * 0.01 + 1e-3).to(torch.bfloat16)
    linear = torchtpu_kernels.Int4Linear(packed, scale, k, matmul=matmul)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2):
            torch.set_num_threads(t)
            outs.append([linear(torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16))
                         for m in (1, 5, 9)])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_this_steps_kernels_give_the_same_bits_with_denormals_flushed(own):
    """torch.set_flush_denormal(True) sets the CPU's denormals-are-zero flag on the calling thread, which computes
    part of each product. fma4 reads its nibbles as float32 subnormals where fma4_subnormals() says so: each block
    clears the flag while it runs, so the bits stay those of a product without it."""
    n, k = 1024 + 48, 192
    packed = words(random_nibbles(n, k, seed=11))
    scale = (torch.rand(n, k // 32, generator=torch.Generator().manual_seed(12)) * 0.01 + 1e-3).to(torch.bfloat16)
    linear = torchtpu_kernels.Int4Linear(packed, scale, k, matmul=own)
    xs = [torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16) for m in (1, 5)]
    want = [linear(x) for x in xs]
    assert torch.set_flush_denormal(True)
    try:
        got = [linear(x) for x in xs]
        flushed = (torch.tensor([2.0 ** -140]) * 1.0).item() == 0.0
        assert flushed, "the flag is still set on this thread after the products"
    finally:
        torch.set_flush_denormal(False)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
