"""The wire between the API gateway and engine rank 0: msgspec messages in length-prefixed frames."""

from ipc.connection import EngineUnavailable, connect, serve_unix
from ipc.framing import (
    ConnectionClosed,
    FrameError,
    FramedStream,
    FrameTooLarge,
    TruncatedFrame,
    decode_message,
    encode_frame,
)
from ipc.messages import (
    PROTOCOL_VERSION,
    Delta,
    Error,
    Finish,
    Generate,
    Hello,
    Info,
    InfoRequest,
    Message,
    Msg,
    SamplingParams,
    Started,
    Welcome,
)

__all__ = [
    "PROTOCOL_VERSION",
    "ConnectionClosed",
    "Delta",
    "EngineUnavailable",
    "Error",
    "Finish",
    "FrameError",
    "FrameTooLarge",
    "FramedStream",
    "Generate",
    "Hello",
    "Info",
    "InfoRequest",
    "Message",
    "Msg",
    "SamplingParams",
    "Started",
    "TruncatedFrame",
    "Welcome",
    "connect",
    "serve_unix",
    "decode_message",
    "encode_frame",
]
