//! Makes the kubelet's registration requests acceptable to tonic.
//!
//! The kubelet's plugin watcher dials the registration socket by its path,
//! and its gRPC client (grpc-go) sends that path, URL-escaped
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F…`), as the HTTP/2
//! `:authority`. The `http` crate under h2 refuses a `%` in an authority's
//! host, so h2 resets every such stream with PROTOCOL_ERROR and the driver
//! is never registered (docs/design.md, "The node plugin: registration and
//! the real-node test bed"). The authority of a request on a unix socket
//! means nothing to this server, so [`AuthorityRewrite`] wraps each accepted connection and, in the bytes
//! the server reads, replaces `:authority` by `localhost` in every header
//! block the client sends. The bytes the server writes pass untouched.
//!
//! A header block is HPACK-compressed against a dynamic table that the
//! client's encoder builds over the whole connection, so [`Rewriter`] keeps
//! one decoder per connection and decodes every block in order. It writes
//! the block again as literal fields without indexing and without Huffman
//! coding: the server's decoder then never needs an entry of a dynamic
//! table, and what the client's encoder believes the server's table holds
//! no longer matters (the server never sees a reference to it).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use loona_hpack::Decoder;
use loona_hpack::decoder::DecoderError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What every rewritten request names as its authority.
pub const AUTHORITY: &[u8] = b"localhost";

/// The client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;

const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// Stream dependency (4 bytes) and weight (1 byte) of a HEADERS frame with
/// the PRIORITY flag.
const PRIORITY_LEN: usize = 5;

/// The largest payload of a frame the rewriter writes: the initial
/// SETTINGS_MAX_FRAME_SIZE, which every HTTP/2 server accepts whatever it
/// advertises.
const MAX_FRAME_PAYLOAD: usize = 16_384;

/// The largest header block (all its fragments) buffered before it is
/// decoded; a registration request's is a few hundred bytes.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;

/// The dynamic table size the client's encoder may use: the server (h2
/// under tonic) advertises no SETTINGS_HEADER_TABLE_SIZE, so the initial
/// 4096 holds, and a larger size update is the client's protocol error.
const MAX_DYNAMIC_TABLE: usize = 4096;

/// Why a connection was closed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RewriteError {
    #[error("the client did not start with the HTTP/2 connection preface")]
    Preface,
    #[error("a HEADERS or CONTINUATION frame on stream 0")]
    StreamZero,
    #[error("a HEADERS frame whose padding or priority exceeds its {0} bytes")]
    BadPadding(usize),
    #[error(
        "a frame of type {kind:#x} on stream {stream} inside the header block of stream {open}"
    )]
    Interleaved { kind: u8, stream: u32, open: u32 },
    #[error("a CONTINUATION frame on stream {0} outside a header block")]
    StrayContinuation(u32),
    #[error("a header block larger than {MAX_HEADER_BLOCK} bytes on stream {0}")]
    TooLarge(u32),
    #[error("the header block of stream {stream} does not decode: {source}")]
    Hpack {
        stream: u32,
        #[source]
        source: DecoderError,
    },
}

/// A header block being gathered: its HEADERS frame and CONTINUATIONs so
/// far.
struct OpenBlock {
    stream: u32,
    /// END_STREAM and PRIORITY of the HEADERS frame.
    flags: u8,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
}

/// Where the rewriter is in the client's byte stream.
enum Phase {
    Preface,
    /// At a frame header.
    Frames,
    /// Inside the payload of a frame that passes through as it is.
    PassThrough(usize),
}

/// The client→server byte stream of one connection, rewritten: [`feed`]
/// takes bytes as they arrive, in pieces of any size, and appends what the
/// server is to read.
///
/// [`feed`]: Rewriter::feed
pub struct Rewriter {
    decoder: Decoder<'static>,
    phase: Phase,
    /// Bytes received but not yet handled (a partial frame header, a
    /// partial header frame).
    pending: Vec<u8>,
    block: Option<OpenBlock>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(MAX_DYNAMIC_TABLE);
        Rewriter {
            decoder,
            phase: Phase::Preface,
            pending: Vec::new(),
            block: None,
        }
    }
}

impl Rewriter {
    /// Handles `input`, appending to `out` every byte the server may read
    /// now. After an error the connection is to be closed: the state is
    /// no longer in step with the client.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        self.pending.extend_from_slice(input);
        let mut pos = 0;
        let result = self.advance(&mut pos, out);
        self.pending.drain(..pos);
        result
    }

    fn advance(&mut self, pos: &mut usize, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        loop {
            let rest = &self.pending[*pos..];
            match self.phase {
                Phase::Preface => {
                    let n = rest.len().min(PREFACE.len());
                    if rest[..n] != PREFACE[..n] {
                        return Err(RewriteError::Preface);
                    }
                    if n < PREFACE.len() {
                        return Ok(());
                    }
                    out.extend_from_slice(PREFACE);
                    *pos += PREFACE.len();
                    self.phase = Phase::Frames;
                }
                Phase::PassThrough(remaining) => {
                    let n = rest.len().min(remaining);
                    out.extend_from_slice(&rest[..n]);
                    *pos += n;
                    if n < remaining {
                        self.phase = Phase::PassThrough(remaining - n);
                        return Ok(());
                    }
                    self.phase = Phase::Frames;
                }
                Phase::Frames => {
                    let Some(header) = rest.get(..FRAME_HEADER_LEN) else {
                        return Ok(());
                    };
                    let len = usize::from(header[0]) << 16
                        | usize::from(header[1]) << 8
                        | usize::from(header[2]);
                    let (kind, flags) = (header[3], header[4]);
                    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]])
                        & 0x7fff_ffff;
                    let is_header_frame = kind == TYPE_HEADERS || kind == TYPE_CONTINUATION;
                    if let Some(open) = &self.block
                        && (kind != TYPE_CONTINUATION || stream != open.stream)
                    {
                        return Err(RewriteError::Interleaved {
                            kind,
                            stream,
                            open: open.stream,
                        });
                    }
                    if !is_header_frame {
                        out.extend_from_slice(header);
                        *pos += FRAME_HEADER_LEN;
                        self.phase = Phase::PassThrough(len);
                        continue;
                    }
                    if stream == 0 {
                        return Err(RewriteError::StreamZero);
                    }
                    let gathered = self.block.as_ref().map_or(0, |b| b.fragment.len());
                    if len > MAX_HEADER_BLOCK - gathered {
                        return Err(RewriteError::TooLarge(stream));
                    }
                    let Some(payload) = rest.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
                        return Ok(());
                    };
                    let payload = payload.to_vec();
                    *pos += FRAME_HEADER_LEN + len;
                    self.header_frame(kind, flags, stream, &payload, out)?;
                }
            }
        }
    }

    /// A whole HEADERS or CONTINUATION frame (the caller checked that a
    /// CONTINUATION belongs to the open block).
    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        if kind == TYPE_CONTINUATION {
            let Some(open) = self.block.as_mut() else {
                return Err(RewriteError::StrayContinuation(stream));
            };
            open.fragment.extend_from_slice(payload);
        } else {
            let mut start = 0;
            let mut padding = 0;
            if flags & FLAG_PADDED != 0 {
                padding = usize::from(*payload.first().ok_or(RewriteError::BadPadding(0))?);
                start = 1;
            }
            let priority = if flags & FLAG_PRIORITY != 0 {
                let bytes = payload
                    .get(start..start + PRIORITY_LEN)
                    .ok_or(RewriteError::BadPadding(payload.len()))?;
                start += PRIORITY_LEN;
                let mut priority = [0; PRIORITY_LEN];
                priority.copy_from_slice(bytes);
                Some(priority)
            } else {
                None
            };
            let end = payload
                .len()
                .checked_sub(padding)
                .filter(|end| *end >= start)
                .ok_or(RewriteError::BadPadding(payload.len()))?;
            self.block = Some(OpenBlock {
                stream,
                flags: flags & (FLAG_END_STREAM | FLAG_PRIORITY),
                priority,
                fragment: payload[start..end].to_vec(),
            });
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else {
            return Err(RewriteError::StrayContinuation(stream));
        };
        let mut fields = Vec::with_capacity(block.fragment.len() + AUTHORITY.len());
        let mut literal = |name: &[u8], value: &[u8]| {
            let value = if name == b":authority" {
                AUTHORITY
            } else {
                value
            };
            // Literal header field without indexing, new name (RFC 7541,
            // section 6.2.2), both strings without Huffman coding.
            fields.push(0);
            encode_integer(name.len(), 7, 0, &mut fields);
            fields.extend_from_slice(name);
            encode_integer(value.len(), 7, 0, &mut fields);
            fields.extend_from_slice(value);
        };
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| literal(&name, &value))
            .map_err(|source| RewriteError::Hpack {
                stream: block.stream,
                source,
            })?;
        write_header_frames(&block, &fields, out);
        Ok(())
    }
}

/// `block`'s rewritten `fields` as one HEADERS frame with END_HEADERS, or
/// a HEADERS frame and CONTINUATIONs when they exceed a frame.
fn write_header_frames(block: &OpenBlock, fields: &[u8], out: &mut Vec<u8>) {
    let priority: &[u8] = block.priority.as_ref().map_or(&[], |p| &p[..]);
    let first_len = fields.len().min(MAX_FRAME_PAYLOAD - priority.len());
    let (first, mut rest) = fields.split_at(first_len);
    let mut flags = block.flags;
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    write_frame_header(
        priority.len() + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream,
        out,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME_PAYLOAD));
        let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame_header(chunk.len(), TYPE_CONTINUATION, flags, block.stream, out);
        out.extend_from_slice(chunk);
        rest = tail;
    }
}

fn write_frame_header(len: usize, kind: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    // len is at most MAX_FRAME_PAYLOAD, which fits the 24-bit field.
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// An HPACK integer with a `prefix`-bit prefix after `leading` bits
/// (RFC 7541, section 5.1).
pub fn encode_integer(value: usize, prefix: u8, leading: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(leading | value as u8);
        return;
    }
    out.push(leading | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// An accepted connection whose client→server bytes go through a
/// [`Rewriter`]; writes go to the connection as they are. A malformed frame
/// or header block ends the connection: the read fails (the server closes
/// it) after a log line.
pub struct AuthorityRewrite<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes the server has not read yet.
    out: Vec<u8>,
    out_pos: usize,
    scratch: Box<[u8]>,
    eof: bool,
    failed: Option<String>,
}

impl<S> AuthorityRewrite<S> {
    pub fn new(inner: S) -> Self {
        AuthorityRewrite {
            inner,
            rewriter: Rewriter::default(),
            out: Vec::new(),
            out_pos: 0,
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            eof: false,
            failed: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRewrite<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(error) = &this.failed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    error.clone(),
                )));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut scratch = ReadBuf::new(&mut this.scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut scratch) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let read = scratch.filled();
            if read.is_empty() {
                this.eof = true;
                continue;
            }
            if let Err(e) = this.rewriter.feed(read, &mut this.out) {
                tracing::warn!(error = %e, "registration connection closed: cannot rewrite its :authority");
                this.failed = Some(e.to_string());
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRewrite<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityRewrite<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
