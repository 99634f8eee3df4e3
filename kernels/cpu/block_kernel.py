"""A native matmul over a GGUF's own Q4_0 / Q4_1 / Q8_0 blocks (`torch.ops.radixlang_cpu.block_mm`).

llama.cpp's method, written here: the weights stay as the file's 32-weight blocks (4-bit codes two a byte, a
scale and minimum per block), the activations are quantized per row and block of 32 to int8 with a scale (and
the block's sum, for the minimum's term), and each block's dot product is an exact integer sum, scaled and
accumulated in fp32. Two layouts (block_mm.cpp documents both, and the activation rule the tests' oracle repeats):
- interleaved, where the build has AVX-512 VNNI: 16 output features side by side, so one 512-bit `dpbusd`
  takes 4 inputs of 16 features and each feature's sum stays in its lane; scales and minimums in fp16, as the
  file stores them. A group of 16 features by up to 8 activation rows is the register tile. On the AMX Xeon VM
  (benchmark/block_mm.py, 2 threads, 2026-12-03 19:19 UTC) a 576 x 3072 Q4_1 layer took 0.025 / 0.031 / 0.055 /
  0.100 ms at 1 / 4 / 8 / 16 rows against the rows layout's 0.037 / 0.101 / 0.201 / 0.364 in the same run (the
  bf16 dense copy: 0.14 at each), so the dense copy now takes over at ~20 rows instead of 7; 4-bit blocks
  read 20 bytes instead of 24.
- rows, elsewhere (AVX2; AVX-VNNI's 256-bit `dpbusd` where the compiler targets it): each feature's blocks
  as stored, a register tile of 4 features by 1-2 rows.
Tiles are split over torch's own thread pool (`at::parallel_for`). `block_operands` packs a layer's
blocks in the layout `interleave()` names.

The op is C++ compiled on this machine with g++ (no ninja, no setuptools): one file against torch's headers,
`-O3 -march=native -fopenmp`, ~15-25 s. The shared object is kept in the cache folder (cache_dir()/kernels),
(or RADIXLANG_KERNEL_DIR: the tests keep it out of their temporary cache folder), named by a hash of the source, torch's version and ABI, the compiler's version and the CPU's flags, and built to a
temporary name then renamed, so processes that build at once (pytest-xdist) each load a whole file.

When it is built: `make install` builds it (`python -m radixlang.kernels.cpu.block_kernel`). Where it is
missing at a model's load (a pip install, a new torch), `available()` starts the build in a background thread
and answers False: that process keeps torch's int4pack path (quant.Int4Linear) and the next one loads the
kernel. The build never lands in a request, and a running server's compiled graphs are not swapped mid-flight
(a recompile costs minutes on a 2-core machine). No AVX2, no g++, or a failed build: logged once, int4pack.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch

from .gguf_blocks import GROUP, GroupQuant

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("block_mm.cpp")
# compiled into the same library: radixlang_cpu::dense_mm, the exact mode's fp32 linears in one order, and
# rms_norm / add_rms_norm, the models' norms in one order, eager and compiled alike (dense_mm.cpp); and
# radixlang_cpu::lora_delta, the gathered LoRA delta (lora_mm.cpp); both include lanes16.h
SOURCES = (SOURCE, Path(__file__).with_name("dense_mm.cpp"), Path(__file__).with_name("lora_mm.cpp"))
HEADERS = (Path(__file__).with_name("lanes16.h"),)
OP_NAMESPACE = "radixlang_cpu"
_lock = threading.Lock()
_state: dict[str, object] = {"loaded": False, "failed": None, "thread": None}


def supported() -> bool:
    """Whether this CPU runs the kernel (AVX2 with FMA: every AVX2 x86-64 CPU) and a compiler exists;
    RADIXLANG_BLOCK_KERNEL=0 turns it off (tests of the fallback, comparisons)."""
    if os.environ.get("RADIXLANG_BLOCK_KERNEL", "1") == "0":
        return False
    return _avx2_and_compiler()


@functools.lru_cache(maxsize=1)
def _avx2_and_compiler() -> bool:
    return torch.cpu._is_avx2_supported() and _compiler() is not None


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()


# -fopenmp: ATen's OpenMP parallel_for is a header template whose `#pragma omp parallel` compiles into this
# object; without the flag it runs serially (the kernel used one thread). libgomp.so.1 resolves to the copy torch
# has loaded, so the op and torch share one thread pool.
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden")


@functools.lru_cache(maxsize=1)
def library_path() -> Path:
    """Where this source, torch, compiler and CPU's build lives in the cache folder."""
    from ...cache_dir import cache_dir

    folder = Path(os.environ.get("RADIXLANG_KERNEL_DIR") or cache_dir() / "kernels")
    compiler = _compiler() or "none"
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    sources = [source.read_text() for source in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\n".join([*sources, " ".join(COMPILE_FLAGS), torch.__version__,
                                    str(torch._C._GLIBCXX_USE_CXX11_ABI), compiler, version, _cpu_flags(),
                                    sys.version]).encode()).hexdigest()[:16]
    return folder / f"block_mm-{key}.so"


def build(path: Path | None = None) -> Path:
    """Compiles the op to `path` (default library_path()); raises on failure. Atomic: temp file + rename."""
    path = path or library_path()
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) found")
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    lib = Path(torch.__file__).parent / "lib"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [compiler, *COMPILE_FLAGS,
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", *includes, *map(str, SOURCES),
           f"-L{lib}", "-ltorch_cpu", "-ltorch", "-lc10", f"-Wl,-rpath,{lib}", "-o", str(tmp)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed ({done.returncode}): {done.stderr[-2000:]}")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("built the block_mm kernel in %.1f s: %s", time.perf_counter() - t0, path)
    return path


def load(path: Path | None = None) -> None:
    """Loads a built op into torch and registers its shape function for torch.compile (once per process)."""
    with _lock:
        if _state["loaded"]:
            return
        torch.ops.load_library(str(path or library_path()))
        torch.library.register_fake(f"{OP_NAMESPACE}::block_mm")(_fake_block_mm)
        torch.library.register_fake(f"{OP_NAMESPACE}::attention_rows")(_fake_attention_rows)
        torch.library.register_fake(f"{OP_NAMESPACE}::dense_mm")(_fake_dense_mm)
        torch.library.register_fake(f"{OP_NAMESPACE}::lora_delta")(_fake_lora_delta)
        torch.library.register_fake(f"{OP_NAMESPACE}::rms_norm")(_fake_rms_norm)
        torch.library.register_fake(f"{OP_NAMESPACE}::add_rms_norm")(_fake_add_rms_norm)
        _state["loaded"] = True


def _fake_block_mm(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                   bits: int) -> torch.Tensor:
    features = qweight.shape[0] * scale.shape[-1] if qweight.dim() == 3 else qweight.shape[0]  # interleaved: groups x 16
    return x.new_empty((x.shape[0], features))


def _fake_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                         row_offset: torch.Tensor, row_len: torch.Tensor, scale: float,
                         k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _fake_dense_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def _fake_lora_delta(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, slots: torch.Tensor,
                     columns: list[int]) -> None:
    return None


def _fake_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


def _fake_add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape)


def interleave() -> int:
    """16 where the kernel runs block_mm.cpp's interleaved layout (built with AVX-512 VNNI), else 0: the rows
    layout, or no kernel (none built yet: this starts no build)."""
    if not _state["loaded"] and _state["failed"] is None and supported() and library_path().exists():
        try:
            load()
        except (OSError, RuntimeError) as e:
            _fail(e)
    return int(torch.ops.radixlang_cpu.block_mm_interleave()) if _state["loaded"] else 0


def layout_tag() -> str:
    """Names the block layout a weight cache entry was packed in: "none" (no kernel loaded), "rows", or the
    interleaved layout with a hash of the two files that define it (block_mm.cpp and this one's block_operands):
    an entry packed by an earlier version (e.g. fp32 scales) is then a miss, not operands the kernel refuses at
    the first request."""
    if not interleave():
        return "rows" if _state["loaded"] else "none"
    return f"interleaved{interleave()}-{_layout_sources_hash()}"


@functools.lru_cache(maxsize=1)
def _layout_sources_hash() -> str:
    return hashlib.sha256(SOURCE.read_bytes() + Path(__file__).read_bytes()).hexdigest()[:16]


def available(wait: bool = False) -> bool:
    """Whether the op is loaded now, loading a built one. Not built yet: starts the build in the background
    (or, with `wait`, builds here) and answers False until a later call finds it (see the module docstring)."""
    if not supported():
        return False
    if _state["loaded"]:
        return True
    if _state["failed"] is not None:
        return False
    path = library_path()
    if not path.exists():
        if not wait:
            _start_background_build(path)
            return False
        try:
            build(path)
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            _fail(e)
            return False
    try:
        load(path)
    except (OSError, RuntimeError) as e:
        _fail(e)
        return False
    return True


def _fail(error: BaseException) -> None:
    if _state["failed"] is None:
        logger.warning("the block_mm CPU kernel is unavailable (%s); low-bit linears use torch's int4pack", error)
    _state["failed"] = error


def _start_background_build(path: Path) -> None:
    with _lock:
        thread = _state["thread"]
        if isinstance(thread, threading.Thread):
            return

        def run() -> None:
            try:
                build(path)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                _fail(e)

        thread = threading.Thread(target=run, name="radixlang-block-mm-build", daemon=True)
        _state["thread"] = thread
        thread.start()
        logger.info("building the block_mm CPU kernel in the background; this process uses int4pack")


if __name__ == "__main__":  # `make install`: build (or find) the kernel now
    logging.basicConfig(level=logging.INFO)
    if available(wait=True):
        print(f"block_mm kernel: ready ({library_path()})")
    else:
        reason = _state["failed"] or "no AVX2, no g++, or RADIXLANG_BLOCK_KERNEL=0"
        print(f"block_mm kernel: unavailable ({reason}); low-bit linears use torch's int4pack")


def block_operands(w: GroupQuant, interleaved: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight, scale, minimum) in the layout block_mm.cpp runs fastest here (`interleaves`), or the one
    `interleaved` names (a tensor-parallel shard takes its whole tensor's: the two layouts round differently)."""
    if interleaved is None:
        interleaved = interleaves(w)
    return interleaved_operands(w, interleave()) if interleaved else row_operands(w)


def interleaves(w: GroupQuant) -> bool:
    """Whether `w` runs the interleaved layout: the kernel built with AVX-512 VNNI, the output features a multiple
    of 16, and scales and minimums exact in fp16; else the rows layout."""
    lanes = interleave()
    return bool(lanes) and w.codes.shape[0] % lanes == 0 and _exact_in_half(w.scale) and _exact_in_half(w.minimum)


def row_operands(w: GroupQuant) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows layout: 4-bit codes two a byte in ggml's order (byte j of a block: code j low, code j + 16 high),
    Q8_0 codes as int8; fp32 scale and minimum per block."""
    n, k = w.codes.shape
    if w.bits == 8:
        qweight = w.codes.to(torch.int8)
    else:
        codes = w.codes.view(n, k // GROUP, GROUP).to(torch.uint8)
        qweight = (codes[..., :GROUP // 2] | (codes[..., GROUP // 2:] << 4)).reshape(n, k // 2)
    return qweight.contiguous(), w.scale.float().contiguous(), w.minimum.float().contiguous()


def interleaved_operands(w: GroupQuant, lanes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The interleaved layout (block_mm.cpp states it): per group of `lanes` features and block, 4 input codes of
    each feature side by side; scale and minimum [groups, blocks, lanes] in fp16 (a GGUF's own precision; "int4"
    rounds its scales to fp16 when it quantizes); Q8_0's minimum is the int16 sum of the block's codes, which takes
    back out the + 128 its activations get."""
    n, k = w.codes.shape
    groups, blocks = n // lanes, k // GROUP

    def by_block(per_block: torch.Tensor) -> torch.Tensor:  # [n, blocks] -> [groups, blocks, lanes]
        return per_block.reshape(groups, lanes, blocks).permute(0, 2, 1).contiguous()

    if w.bits == 8:
        codes = w.codes.view(groups, lanes, blocks, 8, 4).permute(0, 2, 3, 1, 4)  # (group, block, i, lane, j)
        qweight = codes.to(torch.int8).reshape(groups, blocks, 8 * lanes * 4)
        minimum = by_block(w.codes.view(n, blocks, GROUP).sum(-1, dtype=torch.int32).to(torch.int16))
    else:
        codes = w.codes.view(groups, lanes, blocks, 2, 4, 4).to(torch.uint8)  # (group, lane, block, half, i, j)
        packed = codes[:, :, :, 0] | (codes[:, :, :, 1] << 4)  # inputs 4 i + j low, 16 + 4 i + j high
        qweight = packed.permute(0, 2, 3, 1, 4).reshape(groups, blocks, 4 * lanes * 4)
        minimum = by_block(w.minimum.to(torch.float16))
    return qweight.contiguous(), by_block(w.scale.to(torch.float16)), minimum


def _exact_in_half(values: torch.Tensor) -> bool:
    """Whether fp16 holds `values` exactly (a GGUF's scales and minimums are fp16; quantize_int4_rtn rounds its
    own), so the interleaved layout computes with the same weights as the dense copy; else the rows layout."""
    return torch.equal(values.to(torch.float16).float(), values.float())
