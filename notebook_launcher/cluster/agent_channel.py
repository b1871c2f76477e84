"""The channel between the kernel and an agent of a launch across hosts (``hosts=``): frames signed with the
run's secret, so the kernel accepts only what the agent it started sends, in order and unmodified."""

from __future__ import annotations

import struct

from ..schema.decoding import FrameDecoder

AGENT_ENV_VAR = "NOTEBOOK_LAUNCHER_AGENT"  # mpirun: "kernel-address port secret", for agents to connect back
# what comes before the frames: anything earlier (a login banner) is skipped
AGENT_MAGIC = b"NOTEBOOK-LAUNCHER-AGENT/1\n"
_SIGNED_HEADER = struct.Struct(">I")
_MAC_BYTES = 32
MAX_SIGNED_FRAME = 2**32 - 1  # the largest length the header can say (a rank's pickled result can be GBs)


def node_key(secret: bytes, node_rank: int) -> bytes:
    """Each host signs with a key of its own, derived from the run's secret: a frame of one host's stream does
    not verify in another's."""
    import hmac

    return hmac.new(secret, f"node {node_rank}".encode(), "sha256").digest()


def sign_frame(secret: bytes, counter: int, frame: bytes) -> bytes:
    """``[u32 length][HMAC-SHA256(secret, counter || frame)][frame]``: a frame the kernel accepts only if it comes
    from the agent that was given this run's secret, in order, unmodified."""
    import hmac

    mac = hmac.new(secret, counter.to_bytes(8, "big") + frame, "sha256").digest()
    return _SIGNED_HEADER.pack(len(frame)) + mac + frame


class UnverifiedStream(Exception):
    """A host's stream carried a frame that is not signed with the run's secret (or is out of order)."""


class SignedFrameReader:
    """Kernel side: bytes from one agent's SSH channel → verified ``(header, attachment)`` frames.

    Nothing is decoded before its signature is checked; the first bad frame ends the stream for good.
    """

    def __init__(self, secret: bytes):
        self._secret = secret
        self._buffer = bytearray()
        self._counter = 0
        self._started = False

    def feed(self, chunk: bytes) -> list[tuple[dict, bytes]]:
        import hmac

        self._buffer += chunk
        if not self._started:
            at = self._buffer.find(AGENT_MAGIC)
            if at < 0:
                del self._buffer[:-len(AGENT_MAGIC)]
                return []
            del self._buffer[:at + len(AGENT_MAGIC)]
            self._started = True
        frames = []
        prefix = _SIGNED_HEADER.size + _MAC_BYTES
        while len(self._buffer) >= prefix:
            (length,) = _SIGNED_HEADER.unpack_from(self._buffer)
            if length > MAX_SIGNED_FRAME:
                raise UnverifiedStream(f"a frame of {length} bytes")
            if len(self._buffer) < prefix + length:
                break
            mac = bytes(self._buffer[_SIGNED_HEADER.size:prefix])
            frame = bytes(self._buffer[prefix:prefix + length])
            self._counter += 1
            expected = hmac.new(self._secret, self._counter.to_bytes(8, "big") + frame, "sha256").digest()
            if not hmac.compare_digest(mac, expected):
                raise UnverifiedStream(f"frame {self._counter} is not signed with this run's secret")
            del self._buffer[:prefix + length]
            decoder = FrameDecoder()
            decoded = decoder.feed(frame)
            if decoder.broken:
                raise UnverifiedStream(f"frame {self._counter} is not an event: {decoder.broken}")
            if len(decoded) != 1:
                raise UnverifiedStream(f"frame {self._counter} is not one event")
            frames.append(decoded[0])
        return frames
