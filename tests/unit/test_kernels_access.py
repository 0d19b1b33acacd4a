"""lib.kernels.access: sectors of a warp's global access and wavefronts of its shared access,
against per-byte and per-word brute force, published anchors and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import access as ac

WARP = 32


def brute_force_global(addresses, width, mask, sector=32, line=128):
    """Per byte, in plain Python: the set of sectors and lines the active lanes' bytes fall in."""
    touched = set()
    for lane in range(WARP):
        if mask[lane]:
            touched.update(range(int(addresses[lane]), int(addresses[lane]) + width))
    return {b // sector for b in touched}, {b // line for b in touched}, len(touched)


def brute_force_shared(addresses, width, mask, banks=32, bank_width=4):
    """Per word, in plain Python: phases of 128 / width lanes; per phase, the most distinct words one bank serves."""
    per_phase = WARP if width <= bank_width else banks * bank_width // width
    total = 0
    for start in range(0, WARP, per_phase):
        words_by_bank: dict[int, set] = {}
        for lane in range(start, start + per_phase):
            if not mask[lane]:
                continue
            for byte in range(int(addresses[lane]), int(addresses[lane]) + width, bank_width):
                word = byte // bank_width
                words_by_bank.setdefault(word % banks, set()).add(word)
        if words_by_bank:
            total += max(len(v) for v in words_by_bank.values())
    return total


widths = st.sampled_from(ac.WIDTHS)
masks = st.lists(st.booleans(), min_size=WARP, max_size=WARP).map(np.array)
address_lists = st.lists(st.integers(0, 4096), min_size=WARP, max_size=WARP).map(lambda v: np.array(v, np.int64))


# ---- global memory ----------------------------------------------------------------------------------------


def test_the_three_classic_strides():
    """Published anchor: CUDA C++ Best Practices Guide, 'Effects of Strided Accesses': a stride of 2 gives 50%
    load efficiency; contiguous fp32 for a warp is four 32-byte sectors."""
    got = {s: ac.warp_access(ac.strided(s)) for s in (1, 2, 32)}
    assert [(got[s].n_sectors, got[s].efficiency) for s in (1, 2, 32)] == [(4, 1.0), (8, 0.5), (32, 0.125)]
    assert [got[s].n_lines for s in (1, 2, 32)] == [1, 2, 32]


def test_misaligned_sequential_costs_one_more_sector():
    """Published anchor: Best Practices Guide, 'A Sequential but Misaligned Access Pattern': a warp of 4-byte
    words shifted off a 32-byte boundary falls within five 32-byte segments."""
    for offset in (4, 8, 28, 100):
        w = ac.warp_access(ac.misaligned(offset))
        assert (w.n_sectors, w.ideal_sectors, w.excess_sectors) == (5, 4, 1)
    assert ac.warp_access(ac.misaligned(32)).n_sectors == 4


def test_row_major_matrix_column_walk_is_32_sectors():
    rows_walk = ac.warp_access(*ac.matrix_walk(4096, 4096, 4, "row")[:1], 4)
    cols, mask = ac.matrix_walk(4096, 4096, 4, "column")
    col_walk = ac.warp_access(cols, 4, mask)
    assert (rows_walk.n_sectors, col_walk.n_sectors) == (4, 32)
    # a narrow matrix (row pitch 64 B): two lanes share a line but never a sector
    narrow = ac.warp_access(*ac.matrix_walk(64, 16, 4, "column")[:1], 4)
    assert (narrow.n_sectors, narrow.n_lines) == (32, 16)
    # rows past the matrix are inactive lanes
    a, m = ac.matrix_walk(10, 64, 4, "column")
    assert m.sum() == 10 and ac.warp_access(a, 4, m).n_sectors == 10


def test_a_16_byte_range_straddling_a_sector_costs_both():
    a = np.zeros(WARP, np.int64)
    a[0] = 24
    w = ac.warp_access(a, 16, ac.lane_mask(1))
    assert list(w.sectors) == [0, 1] and w.requested_bytes == 16 and not w.naturally_aligned
    assert ac.warp_access(ac.contiguous(16) + 8, 16).n_sectors == 17


def test_broadcast_and_idle():
    b = ac.warp_access(np.full(WARP, 64, np.int64), 4)
    assert (b.n_sectors, b.requested_bytes, b.efficiency) == (1, 4, 0.125)
    idle = ac.warp_access(ac.contiguous(), 4, np.zeros(WARP, bool))
    assert (idle.n_sectors, idle.n_lines, idle.requested_bytes, idle.efficiency) == (0, 0, 0, 0.0)


@settings(max_examples=300, deadline=None)
@given(address_lists, widths, masks)
def test_matches_per_byte_brute_force(addresses, width, mask):
    w = ac.warp_access(addresses, width, mask)
    sectors, lines, requested = brute_force_global(addresses, width, mask)
    assert set(w.sectors.tolist()) == sectors
    assert set(w.lines.tolist()) == lines
    assert w.requested_bytes == requested == int(w.sector_used_bytes.sum())
    assert (w.sector_used_bytes >= 1).all() and (w.sector_used_bytes <= 32).all()


@settings(max_examples=200, deadline=None)
@given(address_lists, widths, masks)
def test_sectors_cover_the_requested_bytes(addresses, width, mask):
    w = ac.warp_access(addresses, width, mask)
    assert w.n_sectors * 32 >= w.requested_bytes
    assert w.n_sectors >= w.ideal_sectors
    assert w.n_sectors <= 2 * w.active_lanes and w.n_lines <= w.n_sectors


@settings(max_examples=200, deadline=None)
@given(address_lists, widths, masks, st.randoms(use_true_random=False))
def test_permuting_lanes_changes_nothing(addresses, width, mask, rnd):
    order = list(range(WARP))
    rnd.shuffle(order)
    a, b = ac.warp_access(addresses, width, mask), ac.warp_access(addresses[order], width, mask[order])
    assert np.array_equal(a.sectors, b.sectors) and a.requested_bytes == b.requested_bytes
    if width <= 4:  # one phase of 32 lanes: any permutation; wider accesses are grouped by lane
        sa = ac.shared_access((addresses // width) * width, width, mask)
        sb = ac.shared_access(((addresses // width) * width)[order], width, mask[order])
        assert sa.wavefronts == sb.wavefronts


@settings(max_examples=200, deadline=None)
@given(address_lists, widths, masks, st.integers(0, WARP - 1), st.integers(0, 10**6))
def test_inactive_lanes_add_nothing(addresses, width, mask, lane, junk):
    mask = mask.copy()
    mask[lane] = False
    moved = addresses.copy()
    moved[lane] = junk
    a, b = ac.warp_access(addresses, width, mask), ac.warp_access(moved, width, mask)
    assert np.array_equal(a.sectors, b.sectors) and a.requested_bytes == b.requested_bytes
    assert str(ac.access_pattern(addresses, width, mask)) == str(ac.access_pattern(moved, width, mask))
    aligned, aligned_moved = (addresses // width) * width, (moved // width) * width
    assert ac.shared_access(aligned, width, mask).wavefronts == ac.shared_access(aligned_moved, width, mask).wavefronts


def test_granules_come_from_the_gpu():
    g = ac.granules("a100-sxm")
    assert (g.warp_size, g.sector_bytes, g.line_bytes, g.banks, g.bank_width_bytes) == (32, 32, 128, 32, 4)
    with pytest.raises(ValueError, match="no CUDA compute capability"):
        ac.granules("mi300x")


@pytest.mark.parametrize("bad, match", [
    (dict(addresses=np.arange(31)), "one address per lane"),
    (dict(addresses=np.arange(32) * 1.0), "integer byte offsets"),
    (dict(addresses=np.arange(32) - 1), ">= 0"),
    (dict(width=3), "width must be one of"),
    (dict(width=True), "width must be one of"),
    (dict(mask=np.ones(32)), "mask must be 32 booleans"),
])
def test_bad_input_is_refused_with_a_message(bad, match):
    kwargs = dict(addresses=ac.contiguous(), width=4, mask=None) | bad
    with pytest.raises(ValueError, match=match):
        ac.warp_access(**kwargs)


# ---- the address-delta test ------------------------------------------------------------------------------


def test_patterns_of_the_classic_traces():
    def kind(a, w=4, m=None):
        return ac.access_pattern(a, w, m).kind

    assert kind(ac.contiguous()) == "contiguous"
    assert kind(ac.contiguous(16), 16) == "contiguous"
    assert kind(ac.misaligned(4)) == "misaligned"
    assert kind(ac.contiguous(16) + 16, 16) == "misaligned"
    assert kind(ac.strided(2)) == "strided" and ac.access_pattern(ac.strided(2)).stride_bytes == 8
    assert kind(ac.contiguous()[::-1].copy()) == "contiguous"  # reversed lanes: still one packed 128 bytes
    assert kind(np.full(WARP, 12, np.int64)) == "broadcast"
    assert kind(ac.random_gather(10**6, seed=3)) == "gather"
    assert kind(ac.contiguous(), 4, np.zeros(WARP, bool)) == "idle"
    assert kind(ac.contiguous(), 4, ac.lane_mask(1)) == "broadcast"
    gappy = ac.lane_mask(32) & (np.arange(WARP) % 3 == 0)
    assert kind(ac.contiguous(), 4, gappy) == "contiguous"  # inactive lanes skipped, the stride is per lane step
    a = ac.contiguous()
    a[5] += 1
    assert kind(a) == "gather"


# ---- shared memory ----------------------------------------------------------------------------------------


def test_bank_of():
    assert ac.bank_of(0) == 0 and ac.bank_of(4) == 1 and ac.bank_of(128) == 0 and ac.bank_of(132) == 1
    assert list(ac.bank_of(np.array([0, 3, 124, 127]))) == [0, 0, 31, 31]
    with pytest.raises(ValueError):
        ac.bank_of(-4)


def test_column_walk_and_padding():
    """A column of float tile[32][32] is one bank (32-way, 32 wavefronts); tile[32][33] spreads it over 32."""
    col = ac.shared_access(*_walk(32, 0, "column"))
    padded = ac.shared_access(*_walk(32, 1, "column"))
    row = ac.shared_access(*_walk(32, 0, "row"))
    assert (col.wavefronts, col.way, col.conflicts) == (32, 32, 31)
    assert set(col.banks.tolist()) == {0}
    assert (padded.wavefronts, padded.conflicts) == (1, 0) and sorted(padded.banks.tolist()) == list(range(32))
    assert row.wavefronts == 1
    assert ac.shared_access(*_walk(16, 0, "column")).wavefronts == 16  # 16-wide tile: banks 0 and 16
    assert ac.shared_access(*_walk(64, 0, "column", elem=8)).wavefronts == 2 * 16  # doubles: 2 phases x 16-way


def _walk(cols, pad, walk, elem=4):
    a, m = ac.tile_walk(cols, pad, walk, 0, elem)
    return a, elem, m


def test_broadcast_stride_and_vector_widths():
    assert ac.shared_access(np.zeros(WARP, np.int64)).wavefronts == 1
    assert ac.shared_access(ac.strided(2)).wavefronts == 2
    assert ac.shared_access(ac.strided(3)).wavefronts == 1  # odd strides are conflict-free
    lds128 = ac.shared_access(ac.contiguous(16), 16)
    # NVIDIA forum, 'Clarification: bank_conflicts metric vs wavefronts for shared memory LDS.128': 4 per instruction
    assert (lds128.wavefronts, lds128.ideal_wavefronts, lds128.conflicts, lds128.lanes_per_phase) == (4, 4, 0, 8)
    assert ac.shared_access(ac.contiguous(8), 8).wavefronts == 2
    assert ac.shared_access(ac.strided(2, 16), 16).wavefronts == 8  # 256-byte stride: two lanes per bank group
    assert ac.shared_access(ac.contiguous(16), 16, ac.lane_mask(8)).wavefronts == 1


@settings(max_examples=300, deadline=None)
@given(address_lists, widths, masks)
def test_shared_matches_per_word_brute_force(addresses, width, mask):
    aligned = (addresses // width) * width
    assert ac.shared_access(aligned, width, mask).wavefronts == brute_force_shared(aligned, width, mask)


def test_misaligned_shared_access_is_refused():
    with pytest.raises(ValueError, match="naturally aligned"):
        ac.shared_access(ac.contiguous(16) + 4, 16)


# ---- a whole matrix ---------------------------------------------------------------------------------------


def brute_force_matrix(rows, cols, w, along):
    """Every warp instruction of the read, each through warp_access (per-lane sectors), summed."""
    total = requests = 0
    if along == "row":
        groups = [[(r, c) for c in range(c0, min(c0 + WARP, cols))] for r in range(rows) for c0 in range(0, cols, WARP)]
    else:
        groups = [[(r, c) for r in range(r0, min(r0 + WARP, rows))] for c in range(cols) for r0 in range(0, rows, WARP)]
    for g in groups:
        a = np.zeros(WARP, np.int64)
        a[:len(g)] = [(r * cols + c) * w for r, c in g]
        total += ac.warp_access(a, w, ac.lane_mask(len(g))).n_sectors
        requests += 1
    return total, requests


@pytest.mark.parametrize("rows, cols, w", [(64, 64, 4), (37, 33, 4), (40, 5, 4), (33, 3, 2), (70, 9, 1), (32, 7, 16),
                                           (5, 100, 8), (96, 2, 16), (65, 1, 4)])
@pytest.mark.parametrize("along", ["row", "column"])
def test_matrix_read_matches_every_warp_counted(rows, cols, w, along):
    m = ac.matrix_read(rows, cols, w, along)
    assert (m.sectors, m.requests) == brute_force_matrix(rows, cols, w, along)
    assert m.moved_bytes >= m.useful_bytes


def test_matrix_read_of_the_square_fp32_matrix():
    row, col = ac.matrix_read(8192, 8192, 4, "row"), ac.matrix_read(8192, 8192, 4, "column")
    assert (row.sectors_per_request, col.sectors_per_request) == (4, 32)
    assert (row.efficiency, col.efficiency) == (1.0, 0.125) and row.requests == col.requests == 8192 * 256


# ---- the explorers (lib.explorers.cuda_kernels_access) -----------------------------------------------------


def test_explorers_report_lib_numbers_and_reuse_their_figures():
    from xml.etree import ElementTree

    from lib.explorers import cuda_kernels_access as ex

    v = ex.coalescing_view("h100-sxm", "strided", 32, 0, 4, 32)
    assert v.values["sectors"] == 32 and v.values["efficiency"] == 0.125 and v.values["time_ratio"] == pytest.approx(8)
    assert dict(v.rows)["pattern (address-delta test)"] == "strided (stride 128 B)"
    ElementTree.fromstring(v.svg())
    b = ex.bank_conflicts_view("h100-sxm", 32, 0, "column", 4, 32)
    assert (b.values["wavefronts"], b.values["conflicts"]) == (32, 31)
    assert ex.bank_conflicts_view("h100-sxm", 32, 1, "column", 4, 32).values["wavefronts"] == 1
    ElementTree.fromstring(b.svg())
    builds = (ex._SECTOR_FIGURE.builds, ex._BANK_FIGURE.builds)
    ex.coalescing_view("l4", "random gather", 3, 17, 16, 9).svg()
    ex.bank_conflicts_view("b200", 7, 3, "row", 16, 20).svg()
    assert (ex._SECTOR_FIGURE.builds, ex._BANK_FIGURE.builds) == builds


# ---- the tiled transpose and the shared-memory pipe --------------------------------------------------------


def test_tiled_transpose_counts():
    """NVIDIA, 'An Efficient Matrix Transpose in CUDA C/C++': tile[32][32] reads a column with 32-way bank
    conflicts; tile[32][33] is conflict-free."""
    plain, padded = ac.tiled_transpose(1024, 0), ac.tiled_transpose(1024, 1)
    assert plain.tiles == 32 * 32 and plain.instructions == 32 * 32 * 32
    assert (plain.store.wavefronts, plain.load.wavefronts, padded.load.wavefronts) == (1, 32, 1)
    assert plain.load_conflicts == plain.instructions * 31 and padded.load_conflicts == 0
    assert plain.hbm_bytes == 2 * 1024 * 1024 * 4 and padded.tile_bytes == 32 * 33 * 4
    assert ac.tiled_transpose(1024, 2).load.wavefronts == 2  # pitch 34 words: gcd(34, 32) = 2
    assert ac.tiled_transpose(1024, 1, 8).load.wavefronts == 2  # doubles, pitch 66 words: 2 half-warps, 1 each
    with pytest.raises(ValueError, match="multiple of the tile side"):
        ac.tiled_transpose(1000)


@pytest.mark.parametrize("pitch_words", range(1, 70))
def test_column_walk_wavefronts_are_the_gcd(pitch_words):
    """Independent closed form for 4-byte elements: lane l's bank is l x p mod 32, so each bank serves gcd(p, 32) words."""
    import math

    a, m = ac.tile_walk(pitch_words, 0, "column")
    assert ac.shared_access(a, 4, m).wavefronts == math.gcd(pitch_words, 32)


def test_smem_time():
    # 132 SMs x 1.83 GHz wavefronts per second on an H100 SXM
    assert ac.smem_time_s(132 * 1.83e9, "h100-sxm") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no SM clock"):
        ac.smem_time_s(1, "l4")
