"""Errors that point the right way: a PARCL_DEVICES spec this machine cannot satisfy names the
variable and what is there; a layer built with a zero size names its argument."""

from __future__ import annotations

import re

import pytest

import parcl as pc
from parcl import runtime


def test_parcl_devices_gpu_without_a_gpu_names_the_variable(monkeypatch):
    # Pretend there is no GPU, whatever this machine has: the message must not depend on it.
    real = runtime._all_of_type
    monkeypatch.setattr(runtime, "_all_of_type", lambda kind: [] if kind == runtime.cl.
                        device_type.GPU else real(kind))
    monkeypatch.setenv("PARCL_DEVICES", "gpu")
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    with pytest.raises(pc.DeviceError) as info:
        pc.devices()
    message = str(info.value)
    assert "PARCL_DEVICES='gpu'" in message and "no OpenCL GPU" in message
    cpu = runtime.parse_spec("cpu")[0]
    assert "This machine has:" in message and cpu.name.strip() in message
    assert "unset it" in message


def test_parcl_devices_with_too_many_gpus_names_the_variable(monkeypatch):
    monkeypatch.setenv("PARCL_DEVICES", "gpu:99")
    with pytest.raises(pc.DeviceError, match=r"PARCL_DEVICES='gpu:99'.*This machine has:"):
        pc.devices()


@pytest.mark.parametrize("spec", ["gpu:-1", "gpu:0,-2", "gpu:2"])
def test_a_gpu_index_outside_the_gpus_is_refused_as_torch_refuses_cuda_minus_1(monkeypatch,
                                                                             spec):
    """``gpu:-1`` took the last GPU (Python's negative index) where no device has index -1,
    so ``parcl-launch --devices gpu:-1`` ran on GPU 1 of 2, silently; torch refuses
    ``cuda:-1``. Indices 0..n-1 name their GPUs as before."""
    fake = runtime.split_device(runtime.parse_spec("cpu")[0], 2)     # two "GPUs"
    real = runtime._all_of_type
    monkeypatch.setattr(runtime, "_all_of_type", lambda kind: list(fake) if kind == runtime.cl.
                        device_type.GPU else real(kind))
    with pytest.raises(pc.DeviceError, match=r"there are 2 GPUs \(indices 0\.\.1\)"):
        runtime.parse_spec(spec)
    assert [d.int_ptr for d in runtime.parse_spec("gpu:1,0")] == [fake[1].int_ptr,
                                                                  fake[0].int_ptr]


def test_an_unknown_spec_in_parcl_devices_names_the_variable(monkeypatch):
    monkeypatch.setenv("PARCL_DEVICES", "tpu")
    with pytest.raises(pc.DeviceError, match=r"PARCL_DEVICES='tpu'.*unknown device spec"):
        pc.devices()


@pytest.mark.parametrize("build, fragment", [
    (lambda: pc.nn.Linear(0, 3), "Linear: in_features must be a positive integer, got 0"),
    (lambda: pc.nn.Linear(3, 0), "Linear: out_features must be a positive integer, got 0"),
    (lambda: pc.nn.Linear(-2, 3), "in_features must be a positive integer, got -2"),
    (lambda: pc.nn.Conv2d(0, 4, 3), "Conv2d: in_channels must be a positive integer, got 0"),
    (lambda: pc.nn.Conv2d(1, 0, 3), "Conv2d: out_channels must be a positive integer"),
    (lambda: pc.nn.Conv2d(1, 4, 0), "Conv2d: kernel_size must be a positive integer"),
    (lambda: pc.nn.Conv2d(1, 4, 3, stride=0), "Conv2d: stride must be a positive integer"),
    (lambda: pc.nn.Conv2d(1, 4, 3, padding=-1), "padding must be a non-negative integer"),
    (lambda: pc.nn.BatchNorm2d(0), "BatchNorm2d: num_features must be a positive integer"),
])
def test_layers_with_a_zero_size_name_the_argument(queue, build, fragment):
    with pytest.raises(pc.ShapeError) as info:
        build()
    assert fragment in str(info.value)
    assert "from_host" not in str(info.value) and "zero-size" not in str(info.value)


def test_layers_with_good_sizes_still_build(queue):
    assert pc.nn.Linear(1, 1).weight.shape == (1, 1)
    assert pc.nn.Conv2d(1, 2, (1, 3), padding=0).weight.shape == (2, 1, 1, 3)


@pytest.mark.parametrize("make, message", [
    (lambda: pc.nn.Conv2d(1, 4, (2.5, 2.5)), "Conv2d: kernel_size must be a positive integer "
                                              "or a pair of them, got (2.5, 2.5)"),
    (lambda: pc.nn.Conv2d(1, 4, 3, stride=(1, 0)), "Conv2d: stride must be a positive"),
    (lambda: pc.nn.ConvTranspose2d(0, 4, 3), "ConvTranspose2d: in_channels must be a positive"),
    (lambda: pc.nn.ConvTranspose2d(1, 4, 0), "ConvTranspose2d: kernel_size must be a positive"),
    (lambda: pc.nn.ConvTranspose2d(1, 4, 3, padding=-1), "padding must be a non-negative"),
], ids=["fractional-kernel", "zero-stride", "tconv-channels", "tconv-kernel", "tconv-padding"])
def test_convolution_sizes_are_checked_before_they_are_converted(make, message):
    """A fractional size is refused, not truncated to an int; ConvTranspose2d gets the same
    checks as Conv2d."""
    with pytest.raises(pc.ShapeError, match=re.escape(message)):
        make()


def test_a_work_group_larger_than_the_device_allows_names_kernel_and_limit(queue):
    """A device that allows fewer work-items per group than a launch asks for (a GPU whose
    limit for a register-heavy kernel is below 256, say) gets a DeviceError that names the
    kernel, the group and the limit, not OpenCL's bare INVALID_WORK_GROUP_SIZE."""
    import numpy as np

    from parcl.kernels._cache import get_kernel
    from parcl.kernels.elementwise import SOURCE

    too_many = 2 * queue.device.max_work_group_size
    t = pc.Tensor.from_host(queue, np.ones(too_many, np.float32))
    axpy = get_kernel(queue, SOURCE, "axpy")
    with pytest.raises(pc.DeviceError, match=rf"kernel axpy: a work-group of \({too_many},\)"
                                             rf".* allows for this kernel \(\d+"):
        axpy(queue, (too_many,), (too_many,), t.data, t.data, np.float32(1), np.int32(too_many))
    np.testing.assert_array_equal(t.to_host(), 1.0)     # nothing ran
