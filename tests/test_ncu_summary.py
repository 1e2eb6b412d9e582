"""benchmarks/ncu_summary.py reads Nsight Compute's source-page CSV: every stall sample lands in exactly
one category, by the instruction sampled and the ones before it (a branch after an mbarrier try-wait
is a wait for data or a slot, a NOP after a barrier is a parked warp), and each kernel's block is
read on its own."""
import csv

from benchmarks.ncu_summary import read_source, stall_categories

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)"]
BODY = [("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 3), ("@!P0  BRA 0x100", 40),
        ("WARPGROUP.ARRIVE", 2), ("QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT", 5),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 30), ("FADD R5, R88, R5", 7), ("LDS.64 R4, [R2]", 1),
        ("BAR.SYNC.DEFER_BLOCKING 0x1", 0), ("NOP", 50), ("IADD3 R1, R1, 0x1, RZ", 4)]


def _write(path, kernels):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for name, body in kernels:
            w.writerow(["Kernel Name", name])
            w.writerow(HEADER)
            for i, (sass, n) in enumerate(body):
                w.writerow([hex(0x1000 + 16 * i), "      " + sass, n, n])


def test_categories_partition_the_samples(tmp_path):
    path = tmp_path / "src.csv"
    _write(path, [("k_a", BODY), ("k_b", BODY[:3])])
    kernels = read_source(str(path))
    assert [k[0] for k in kernels] == ["k_a", "k_b"] and [len(k[2]) for k in kernels] == [len(BODY), 3]
    cats = stall_categories(kernels[0][1], kernels[0][2])
    assert sum(cats.values()) == sum(n for _, n in BODY)
    assert cats["mbarrier wait (data or slot)"] == 40 and cats["parked warps"] == 50
    assert cats["wgmma wait"] == 30 and cats["wgmma issue"] == 2 + 5 and cats["fp32 math"] == 7
    assert cats["shared loads"] == 1 and cats["other"] == 3 + 4
    # a branch with no try-wait before it is not a wait for data
    cats_b = stall_categories(kernels[0][1], [["0x0", "@!P0  BRA 0x100", "9", "9"]])
    assert cats_b["other"] == 9 and cats_b["mbarrier wait (data or slot)"] == 0
