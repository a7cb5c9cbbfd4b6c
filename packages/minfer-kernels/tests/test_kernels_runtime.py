"""The device runtime: devices, buffers and copies, streams, events, and the capture guard."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from kernel_testing import from_device, randn, requires_gpu, silu, to_device

import minfer_kernels as mk
from minfer_kernels import kernels

pytestmark = requires_gpu


def test_devices_are_described_and_this_build_runs_on_them():
    devices = mk.devices()
    assert len(devices) == mk.device_count() >= 1
    info = mk.build_info()
    for device in devices:
        assert device.name
        assert device.compute_capability >= (7, 0)
        assert device.sm_count > 0
        assert device.total_memory > 2**30
        assert device.l2_cache_bytes > 0 and device.max_shared_memory_per_block >= 48 * 1024
        arch = device.compute_capability[0] * 10 + device.compute_capability[1]
        assert arch in info.archs_sass or min(info.archs_ptx) <= arch, f"sm_{arch}: no SASS and no usable PTX"
    free, total = mk.mem_info()
    assert 0 < free <= total
    assert info.driver_version is not None


def test_device_buffer_round_trip_at_an_offset(rng, stream):
    data = rng.integers(0, 256, 4097, dtype=np.uint8)
    buffer = mk.DeviceBuffer(5000)
    assert buffer.nbytes == 5000 and buffer.ptr != 0 and buffer.ptr % 256 == 0
    buffer.copy_from_host(data, stream.handle, offset=903)
    back = np.zeros(4097, np.uint8)
    buffer.copy_to_host(back, stream.handle, offset=903)
    assert np.array_equal(back, data)


def test_read_only_arrays_upload(rng, stream):
    data = randn(rng, 896)
    data.setflags(write=False)  # as a memory-mapped GGUF tensor is
    assert np.array_equal(from_device(mk.upload(data, stream.handle), 896, np.float32, stream), data)


def test_async_copies_through_pinned_memory_are_stream_ordered(rng, stream):
    n = 1 << 20
    staging_in = mk.PinnedBuffer(n * 4)
    staging_out = mk.PinnedBuffer(n * 4)
    x = staging_in.numpy().view(np.float32)
    x[:] = randn(rng, n)
    device = mk.DeviceBuffer(n * 4)
    device.copy_from_host_async(x, stream.handle)  # returns at once; the kernel below waits for it
    kernels.scale_f32(device.ptr, device.ptr, 2.0, n, stream.handle)
    out = staging_out.numpy().view(np.float32)
    device.copy_to_host_async(out, stream.handle)
    mk.sync(stream.handle)
    assert np.array_equal(out, x * np.float32(2.0))


def test_a_pinned_view_keeps_its_memory_alive():
    pinned = mk.PinnedBuffer(64)
    assert pinned.ptr != 0 and pinned.nbytes == 64
    view = pinned.numpy()
    assert view.shape == (64,) and view.dtype == np.uint8
    view[:] = 7
    del pinned
    gc.collect()
    assert (view == 7).all()


def test_a_copy_that_does_not_fit_is_refused_before_the_call(stream):
    buffer = mk.DeviceBuffer(1024)
    too_big = np.zeros(1025, np.uint8)
    latched_before = mk.latched_errors()
    with pytest.raises(ValueError, match="do not fit a DeviceBuffer of 1024 bytes"):
        buffer.copy_from_host(too_big, stream.handle)
    with pytest.raises(ValueError, match="do not fit"):
        buffer.copy_to_host(too_big, stream.handle)
    with pytest.raises(ValueError, match="at offset 100"):
        buffer.copy_from_host(np.zeros(1000, np.uint8), stream.handle, offset=100)
    with pytest.raises(ValueError, match="do not fit"):
        buffer.copy_from_host_async(too_big, stream.handle)
    with pytest.raises(ValueError, match="do not fit"):
        buffer.copy_to_host_async(too_big, stream.handle)
    mk.sync(stream.handle)  # no CUDA call failed: nothing is pending
    assert mk.latched_errors() == latched_before


def test_host_arrays_are_never_copied_behind_the_callers_back(stream):
    buffer = mk.DeviceBuffer(64)
    strided = np.zeros(32, np.float32)[::2]  # a non-contiguous view: a copy would swallow the download
    with pytest.raises(TypeError):
        buffer.copy_to_host(strided, stream.handle)


def test_device_to_device_copy(rng, stream):
    data = randn(rng, 4097)
    source = to_device(data, stream)
    target = mk.DeviceBuffer(4097 * 4 + 64)
    mk.copy_d2d(target.ptr + 64, source.ptr, 4097 * 4, stream.handle)
    assert np.array_equal(mk.download(target, 4097, np.float32, stream.handle, offset=64), data)


def test_events_time_gpu_work(rng, stream):
    x = to_device(randn(rng, 1 << 20), stream)
    start, end = mk.Event(), mk.Event()
    start.record(stream.handle)
    for _ in range(10):
        kernels.scale_f32(x.ptr, x.ptr, 1.0001, 1 << 20, stream.handle)
    end.record(stream.handle)
    end.synchronize()
    elapsed = start.elapsed_ms(end)
    assert 0.0 < elapsed < 10_000.0


def test_a_stream_waits_for_an_event_recorded_on_another(rng):
    producer, consumer = mk.Stream(), mk.Stream()
    n = 1 << 22
    data = randn(rng, n)
    x = mk.upload(data)
    y = mk.DeviceBuffer(n * 4)
    for _ in range(20):  # enough work that the consumer would overtake an unordered producer
        kernels.scale_f32(x.ptr, x.ptr, 2.0, n, producer.handle)
    ready = mk.Event(timing=False)
    ready.record(producer.handle)
    consumer.wait(ready)
    kernels.add_f32(x.ptr, x.ptr, y.ptr, n, consumer.handle)
    consumer.synchronize()
    assert np.array_equal(mk.download(y, n, np.float32, consumer.handle), data * np.float32(2.0**21))


def test_a_sync_inside_a_capture_window_is_refused_and_the_capture_survives(rng, stream):
    data = randn(rng, 896)
    x = to_device(data, stream)
    mk.begin_capture(stream.handle)
    assert mk.is_capturing(stream.handle)
    kernels.silu_f32(x.ptr, 896, stream.handle)
    with pytest.raises(mk.CudaError) as refused:
        mk.sync(stream.handle)
    assert refused.value.name == "cudaErrorStreamCaptureUnsupported" and not refused.value.latched
    with pytest.raises(mk.CudaError, match="capturing"):
        x.copy_to_host(np.empty(896, np.float32), stream.handle)
    with pytest.raises(mk.CudaError, match="already capturing"):
        mk.begin_capture(stream.handle)
    graph = mk.end_capture(stream.handle)
    assert not mk.is_capturing(stream.handle)
    assert graph.node_count == 1
    graph.launch(stream.handle)
    np.testing.assert_allclose(from_device(x, 896, np.float32, stream), silu(data), rtol=1e-6)
