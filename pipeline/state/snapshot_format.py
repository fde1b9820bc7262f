"""Full snapshots of a partition's state: the format (version 1), how the newest complete one is found, and how a
restore and the pipeline's snapshot on shutdown use it (docs/guarantees.md: complete-restore,
all-or-nothing-snapshots).

Without full snapshots, restoring partition p replays p's whole changelog: restore time grows with history. With
them, restore = the latest complete snapshot of p + the changelog since the offset it covers, so it grows with the
state size plus the tail since the last compaction.

Topics (both created by the runner at start-up, with the input's partition count; partition p belongs to input p)
    <app>-changelog   p's state changes and per transaction a checkpoint (pipeline/state/changelog.py), written by the
                      pipeline inside its transactions
    <app>-snapshots   full snapshots of p, written by the compaction job (`snapshots compact`, the package
                      snapshots/) and, on a clean stop with SNAPSHOT_ON_SHUTDOWN=true, by the pipeline itself

A snapshot of p is a run of chunk records followed by ONE manifest record, both in partition p. A chunk holds up to
512 KiB of raw entries (state key -> encoded state value, opaque bytes) as length arrays + blobs, decoded with a few
C-level calls per chunk, CRC-32 per chunk; the producer compresses batches (lz4). The manifest (JSON) holds the
snapshot id, generation, the changelog offset it covers (next offset: the snapshot is the fold of the changelog below
it), the input offset it covers (the last checkpoint folded in), chunk count, entry count, checksum (CRC-32 over the
chunks' CRCs), format version, created-at, the offset of its first chunk and its predecessor's id. A snapshot without
a committed manifest does not exist. Chunks are written first (`snapshot_writer.emit_chunks`, the one chunk emitter
of the pipeline and the Spark job); manifests go last, in a transaction.

Chunk record: key `<snapshot id>:<index>`, header `eos.snapshot=chunk`, value = a 44-byte header then a body:

    header  "<4sBBH16sIIIII": magic b"EOSS", format version, flags, header length, snapshot id (16 raw bytes), chunk
            index, entry count n, CRC-32 of the body, key blob length (bytes), value blob length (bytes)
    body    [n uint32 key lengths] [n uint32 value lengths] key blob (UTF-8) value blob

Keys and values are stored one of two ways, chosen per chunk and named by the flags: joined by NUL when none of them
contains a NUL (keys almost never do; JSON values never do), decoded by one `str.split` / `bytes.split`; otherwise
concatenated with a length array (key lengths in code points of the decoded key blob, so it is decoded once and
sliced), decoded with `array.frombytes`, `itertools.accumulate` and `map(slice)`. Either way a chunk decodes in a
handful of C-level calls whatever n is, with no per-entry struct call.

Manifest record: key = snapshot id, header `eos.snapshot=manifest`, value = JSON (see `Manifest`). Its checksum is
the CRC-32 over the chunks' CRC-32s (4 bytes little-endian each, in index order), so a reader can verify the whole
snapshot while it streams the chunks. State values are opaque bytes throughout.

Verifying a snapshot (`ChunkSet`, the one verifier of the restore and of the compaction job's base)
    The chunks of a manifest lie in [first chunk, manifest). All indexes 0..chunks-1 must be present with good CRCs,
    the entry count and the checksum must match the manifest; chunks of other snapshots in between are skipped by id,
    duplicates (a retried Spark task) read once. A snapshot that fails is `InvalidSnapshot`: the reader falls back to
    the previous one.

Finding the latest (pipeline/state/snapshot_finder.py)
    The snapshot topic's p is scanned back from its last stable offset in growing windows (8, 32, 128, ...), each
    read with read_committed until the consumer's position reaches the window's end: markers, aborted chunks and
    aborted manifests occupy offsets and are stepped over, never "end - 1", never one poll. The newest manifest's
    chunks are read and verified (`ChunkLoad`). A snapshot that fails is skipped with a warning and the previous one
    is tried; with none left, the base is the empty state at changelog offset 0. Every Kafka call has a time-out; a
    restore that does not finish says which phase and offsets stuck.

Restore (pipeline/state/restore.py), after fencing, in steps of RESTORE_STEP_MS between polls (p stays paused)
    snapshot (scan + load; a second consumer prefetches the changelog tail meanwhile) -> changelog of p from the
    covered offset to its high watermark -> the last checkpoint (from the tail, or the snapshot's input offset if the
    tail has none) must equal the group's committed offset of p. If the changelog's low watermark is above the
    covered offset (or above 0 without a snapshot), p refuses to start with a RestoreError that says what is missing
    and how to repair it. A restore that has records deleted under it (it began on a generation the compaction job
    has since deleted) starts over: auto.offset.reset=error makes that an error, never a silent jump. Metrics:
    pipeline_restore_snapshot_entries (entries from the snapshot) and pipeline_restore_records (changelog records
    read) per partition.

Snapshot on shutdown (SNAPSHOT_ON_SHUTDOWN=true, pipeline/state/snapshot_writer.py)
    On a clean stop the runner commits what is open, then writes p's state (chunks + manifest) in one more
    transaction of p's own producer, so a fenced owner publishes nothing. It covers the changelog below its last
    committed checkpoint's offset + 1 (known from that record's delivery report; without it, or with nothing new
    since the snapshot p was restored from, no snapshot is written) and the input below the committed offset. A
    compaction planned before it sees a newer manifest when it publishes and skips p; the next compaction uses it as
    its base. Its generation is its base's + 1, so a racing compaction may carry the same number: snapshots are
    ordered by their place in the topic, never by generation.

Both topics are created with retention.ms=-1 and retention.bytes=-1: only the compaction job deletes from them, below
the previous generation (the package snapshots/ says who deletes what, and why it is safe).
"""

from __future__ import annotations

import builtins
import hashlib
import struct
import sys
import time
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate, islice
from typing import AnyStr

import orjson

FORMAT_VERSION = 1
MAGIC = b"EOSS"
HEADER = struct.Struct("<4sBBH16sIIIII")
KEYS_SEPARATED = 1  # flag: keys joined by NUL (no key contains one), no key length array
VALUES_SEPARATED = 2  # flag: values joined by NUL, no value length array
SEP, BSEP = "\x00", b"\x00"
KIND_HEADER = "eos.snapshot"
CHUNK_HEADER = (KIND_HEADER, b"chunk")
MANIFEST_HEADER = (KIND_HEADER, b"manifest")
# Raw payload per chunk before compression. The broker's default message.max.bytes is ~1 MiB; a batch holds whole
# records, so half of it leaves room for the record overhead and never depends on how well the values compress.
DEFAULT_CHUNK_BYTES = 512 * 1024
ENTRY_OVERHEAD = 8  # two uint32 lengths

if array("I").itemsize != 4:  # pragma: no cover - every platform CPython supports today has a 4-byte unsigned int
    raise ImportError("array('I') is not 4 bytes wide here; the chunk codec needs it")
_SWAP = sys.byteorder != "little"


class CorruptChunk(ValueError):
    """A chunk record that cannot be decoded or whose checksum disagrees."""


class InvalidSnapshot(ValueError):
    """This snapshot is incomplete or corrupt; use an older one."""


def snapshot_topic(app_id: str) -> str:
    return f"{app_id}-snapshots"


def snapshot_id(app_id: str, partition: int, base_id: str | None, changelog_start: int, changelog_end: int) -> str:
    """Deterministic from what the snapshot is made of: the same inputs always give the same id
    (docs/guarantees.md: all-or-nothing-snapshots)."""
    material = f"v{FORMAT_VERSION}|{app_id}|{partition}|{base_id or '-'}|{changelog_start}|{changelog_end}"
    return hashlib.sha256(material.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Manifest:
    snapshot_id: str
    generation: int
    partition: int
    changelog_topic: str
    changelog_offset: int  # next changelog offset: the snapshot is the fold of the changelog below it
    input_offset: int | None  # next input offset covered (the last checkpoint folded in); None: no checkpoint yet
    chunks: int
    entries: int
    bytes: int  # raw chunk payload bytes
    checksum: int  # CRC-32 over the chunks' CRC-32s
    first_chunk_offset: int  # no chunk of this snapshot lies below it in the snapshot topic
    created_at: str
    previous_id: str | None = None
    changelog_records: int = 0  # changelog records folded into it since the previous snapshot
    format: int = FORMAT_VERSION
    # Several inputs (docs/inputs.md): the next offset of every co-partitioned topic it covers; None for one input.
    input_offsets: dict[str, int | None] | None = None

    # `builtins.bytes`: in this class body, `bytes` names the field above.
    def encode(self) -> builtins.bytes:
        return orjson.dumps({"type": "eos-snapshot-manifest", **asdict(self)})

    @staticmethod
    def decode(value: builtins.bytes) -> Manifest:
        try:
            fields = orjson.loads(value)
            if fields.pop("type", None) != "eos-snapshot-manifest":
                raise ValueError("not a snapshot manifest")
            return Manifest(**fields)
        except (orjson.JSONDecodeError, TypeError, ValueError) as e:
            raise ValueError(f"unreadable manifest: {e}") from e


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def manifest_checksum(chunk_crcs: Sequence[int]) -> int:
    return zlib.crc32(struct.pack(f"<{len(chunk_crcs)}I", *chunk_crcs))


def is_chunk(headers: list[tuple[str, bytes]] | None) -> bool:
    return headers is not None and CHUNK_HEADER in headers


def is_manifest(headers: list[tuple[str, bytes]] | None) -> bool:
    return headers is not None and MANIFEST_HEADER in headers


def chunk_key(sid: str, index: int) -> bytes:
    return f"{sid}:{index}".encode()


# -- encoding ------------------------------------------------------------------------------------------------------
def encode_chunk(sid: str, index: int, keys: Sequence[str], values: Sequence[bytes]) -> tuple[bytes, int]:
    """One chunk payload and its body CRC-32."""
    n = len(keys)
    flags = 0
    parts: list[bytes] = []
    kjoined = SEP.join(keys)
    if n and kjoined.count(SEP) == n - 1:  # no key contains NUL: separated, decoded by one split()
        flags |= KEYS_SEPARATED
        kblob = kjoined.encode()
    else:
        klens = array("I", map(len, keys))
        if _SWAP:  # pragma: no cover
            klens.byteswap()
        parts.append(klens.tobytes())
        kblob = "".join(keys).encode()
    vjoined = BSEP.join(values)
    if n and vjoined.count(BSEP) == n - 1:  # no value contains NUL (JSON never does)
        flags |= VALUES_SEPARATED
        vblob = vjoined
    else:
        vlens = array("I", map(len, values))
        if _SWAP:  # pragma: no cover
            vlens.byteswap()
        parts.append(vlens.tobytes())
        vblob = b"".join(values)
    body = b"".join((*parts, kblob, vblob))
    crc = zlib.crc32(body)
    header = HEADER.pack(
        MAGIC, FORMAT_VERSION, flags, HEADER.size, bytes.fromhex(sid), index, n, crc, len(kblob), len(vblob)
    )
    return header + body, crc


def split_chunks(
    items: Iterable[tuple[str, bytes]], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[tuple[list[str], list[bytes]]]:
    """Groups (key, value) pairs into chunks of at most chunk_bytes raw payload (one oversized entry: its own)."""
    keys: list[str] = []
    values: list[bytes] = []
    size = 0
    for key, value in items:
        entry = len(key) * 4 + len(value) + ENTRY_OVERHEAD  # len(key)*4 bounds its UTF-8 length cheaply
        if keys and size + entry > chunk_bytes:
            yield keys, values
            keys, values, size = [], [], 0
        keys.append(key)
        values.append(value)
        size += entry
    if keys:
        yield keys, values


# -- decoding ------------------------------------------------------------------------------------------------------
def peek_chunk(value: bytes) -> tuple[str, int]:
    """(snapshot id, chunk index) without decoding the body."""
    if len(value) < HEADER.size or value[:4] != MAGIC:
        raise CorruptChunk("not a snapshot chunk (bad magic or too short)")
    _, _, _, _, sid, index, *_ = HEADER.unpack_from(value)
    return sid.hex(), index


def decode_chunk(value: bytes) -> tuple[str, int, list[str], list[bytes], int]:
    """(snapshot id, index, keys, values, body CRC-32); CorruptChunk if anything disagrees."""
    if len(value) < HEADER.size or value[:4] != MAGIC:
        raise CorruptChunk("not a snapshot chunk (bad magic or too short)")
    _, version, flags, header_len, sid, index, n, crc, klen, vlen = HEADER.unpack_from(value)
    if version != FORMAT_VERSION:
        raise CorruptChunk(f"chunk format version {version}, this reader knows {FORMAT_VERSION}")
    view = memoryview(value)
    body = view[header_len:]
    arrays = (0 if flags & KEYS_SEPARATED else 4 * n) + (0 if flags & VALUES_SEPARATED else 4 * n)
    if len(body) != arrays + klen + vlen:
        raise CorruptChunk(f"chunk {index}: body is {len(body)} bytes, its header says {arrays + klen + vlen}")
    if zlib.crc32(body) != crc:
        raise CorruptChunk(f"chunk {index}: CRC-32 mismatch")
    position = header_len
    klens = vlens = None
    if not flags & KEYS_SEPARATED:
        klens = array("I")
        klens.frombytes(body[: 4 * n])
        position += 4 * n
    if not flags & VALUES_SEPARATED:
        vlens = array("I")
        vlens.frombytes(body[position - header_len : position - header_len + 4 * n])
        position += 4 * n
    if _SWAP:  # pragma: no cover
        for lens in (klens, vlens):
            if lens is not None:
                lens.byteswap()
    try:
        kstr = value[position : position + klen].decode()
    except UnicodeDecodeError as e:
        raise CorruptChunk(f"chunk {index}: keys are not UTF-8 ({e})") from e
    vblob = value[position + klen : position + klen + vlen]
    keys = _pieces(kstr, SEP, klens, n)
    values = _pieces(vblob, BSEP, vlens, n)
    if len(keys) != n or len(values) != n:
        raise CorruptChunk(f"chunk {index}: {len(keys)} keys and {len(values)} values, its header says {n}")
    return sid.hex(), index, keys, values, crc


def _pieces(blob: AnyStr, sep: AnyStr, lengths: array[int] | None, n: int) -> list[AnyStr]:
    if n == 0:
        return []
    if lengths is None:
        return blob.split(sep)
    offsets = list(accumulate(lengths, initial=0))
    if offsets[-1] != len(blob):
        raise CorruptChunk("lengths do not add up to the blob")
    return list(map(blob.__getitem__, map(slice, offsets, islice(offsets, 1, None))))


# -- verifying -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Chunk:
    index: int
    keys: list[str]
    values: list[bytes]
    crc: int


class ChunkSet:
    """The chunks of one snapshot as a reader meets them, checked against its manifest. The one verifier of both
    readers: the restore (snapshot_finder.ChunkLoad, one consumer) and the compaction job's base (snapshots/fold.py,
    decoded on Spark executors, checked where the partition's pieces meet)."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.errors: list[str] = []  # chunks of this snapshot (or unidentifiable ones) that could not be read
        self._crcs: dict[int, int] = {}
        self._counts: dict[int, int] = {}

    def wants(self, sid: str, index: int) -> bool:
        """False for another snapshot's chunk (an interleaved or crashed run) and for an index already read (a
        duplicate written by a retried task)."""
        return sid == self.manifest.snapshot_id and index not in self._crcs

    def read(self, value: bytes, where: str) -> Chunk | None:
        """Decodes and records a chunk record of this snapshot; None for one to skip or one that is unreadable (noted
        with `where`, e.g. its offset, for the error message)."""
        try:
            sid, index = peek_chunk(value)
            if not self.wants(sid, index):
                return None
            _, index, keys, values, crc = decode_chunk(value)
        except CorruptChunk as e:
            self.unreadable(f"{where}: {e}")
            return None
        self.add(index, crc, len(keys))
        return Chunk(index, keys, values, crc)

    def add(self, index: int, crc: int, entries: int) -> None:
        """Records a chunk decoded elsewhere (a Spark executor); a duplicate index is counted once."""
        if index not in self._crcs:
            self._crcs[index] = crc
            self._counts[index] = entries

    def unreadable(self, error: str) -> None:
        self.errors.append(error)

    def verify(self, distinct_keys: int) -> None:
        """InvalidSnapshot saying what is wrong unless every chunk is there, the entries (and the `distinct_keys`
        they gave) and the checksum agree with the manifest."""
        m = self.manifest
        missing = [i for i in range(m.chunks) if i not in self._crcs]
        if missing:
            detail = f"; unreadable chunks: {'; '.join(self.errors[:3])}" if self.errors else ""
            raise InvalidSnapshot(
                f"{len(missing)} of {m.chunks} chunks missing or corrupt (indexes {missing[:5]}){detail}"
            )
        if len(self._crcs) != m.chunks:
            raise InvalidSnapshot(f"{len(self._crcs)} chunks found, the manifest says {m.chunks}")
        count = sum(self._counts.values())
        if count != m.entries or distinct_keys != m.entries:
            raise InvalidSnapshot(f"{count} entries ({distinct_keys} distinct keys), the manifest says {m.entries}")
        checksum = manifest_checksum([self._crcs[i] for i in range(m.chunks)])
        if checksum != m.checksum:
            raise InvalidSnapshot(f"checksum {checksum:#010x}, the manifest says {m.checksum:#010x}")
