"""The read limit the benches divide by, beside the copy: a read-only stream, the fastest of the kernels tried."""
from torchtpu_rs.bandwidth import read_bandwidth_gb_s


def test_the_read_limit_names_the_fastest_kernel_it_tried():
    rate, kernel = read_bandwidth_gb_s(gib=1 / 64, tries=1)
    assert rate > 0 and kernel in {"float32 sum", "float32 max", "int32 max"}
