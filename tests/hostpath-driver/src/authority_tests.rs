use std::collections::VecDeque;

use super::*;

/// The client side of one connection, encoding header blocks as grpc-go's
/// encoder does: a field of the static or dynamic table by its index, any
/// other as a literal with incremental indexing (its name by index when a
/// table has it), each string Huffman-coded when that is shorter.
struct GoLikeEncoder {
    /// Newest first: index 62 is the front.
    dynamic: VecDeque<(Vec<u8>, Vec<u8>)>,
}

/// The static table entries the requests below use (RFC 7541, Appendix A).
const STATIC: &[(usize, &str, &str)] = &[
    (1, ":authority", ""),
    (2, ":method", "GET"),
    (3, ":method", "POST"),
    (4, ":path", "/"),
    (6, ":scheme", "http"),
    (31, "content-type", ""),
    (58, "user-agent", ""),
];

/// RFC 7541, Appendix B: (code, length in bits) of each symbol.
const HUFFMAN: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

fn huffman(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u64, 0u32);
    for &b in s {
        let (code, len) = HUFFMAN[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        // Padded with the most significant bits of EOS (all ones).
        out.push(((acc << (8 - bits)) | (0xff >> bits)) as u8);
    }
    out
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    let coded = huffman(s);
    if coded.len() < s.len() {
        encode_integer(coded.len(), 7, 0x80, out);
        out.extend_from_slice(&coded);
    } else {
        encode_integer(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

impl GoLikeEncoder {
    fn new() -> Self {
        GoLikeEncoder {
            dynamic: VecDeque::new(),
        }
    }

    fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(name, value) in fields {
            let exact = STATIC
                .iter()
                .find(|(_, n, v)| *n == name && *v == value)
                .map(|(i, _, _)| *i)
                .or_else(|| {
                    self.dynamic
                        .iter()
                        .position(|(n, v)| n == name.as_bytes() && v == value.as_bytes())
                        .map(|p| 62 + p)
                });
            if let Some(index) = exact {
                encode_integer(index, 7, 0x80, &mut out);
                continue;
            }
            let name_index = STATIC
                .iter()
                .find(|(_, n, _)| *n == name)
                .map(|(i, _, _)| *i)
                .or_else(|| {
                    self.dynamic
                        .iter()
                        .position(|(n, _)| n == name.as_bytes())
                        .map(|p| 62 + p)
                });
            match name_index {
                Some(index) => encode_integer(index, 6, 0x40, &mut out),
                None => {
                    out.push(0x40);
                    string(name.as_bytes(), &mut out);
                }
            }
            string(value.as_bytes(), &mut out);
            self.dynamic
                .push_front((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
        out
    }
}

const KUBELET_AUTHORITY: &str =
    "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fhostpath.csi.k8s.io-reg.sock";

fn request(path: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", KUBELET_AUTHORITY),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.1"),
        ("te", "trailers"),
        ("grpc-timeout", "59999986u"),
    ]
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame_header(payload.len(), kind, flags, stream, &mut out);
    out.extend_from_slice(payload);
    out
}

/// A parsed frame of the rewriter's output.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn parse_frames(mut bytes: &[u8]) -> Vec<Frame> {
    assert!(bytes.starts_with(PREFACE), "the preface comes first");
    bytes = &bytes[PREFACE.len()..];
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        frames.push(Frame {
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]),
            payload: bytes[9..9 + len].to_vec(),
        });
        bytes = &bytes[9 + len..];
    }
    frames
}

/// Decodes an output header block with a decoder of its own: the rewritten
/// blocks must not depend on any dynamic table.
fn fields_of(block: &[u8]) -> Vec<(String, String)> {
    Decoder::new()
        .decode(block)
        .expect("the rewritten block decodes on its own")
        .into_iter()
        .map(|(n, v)| {
            (
                String::from_utf8(n).expect("name"),
                String::from_utf8(v).expect("value"),
            )
        })
        .collect()
}

fn owned(fields: &[(&str, &str)]) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

fn with_localhost(fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut fields = owned(fields);
    for (n, v) in &mut fields {
        if n == ":authority" {
            *v = "localhost".to_owned();
        }
    }
    fields
}

fn rewrite(input: &[u8]) -> Result<Vec<u8>, RewriteError> {
    let mut out = Vec::new();
    Rewriter::default().feed(input, &mut out).map(|()| out)
}

const SETTINGS: u8 = 0x4;
const DATA: u8 = 0x0;

/// A connection of two gRPC calls as the kubelet makes them: the second
/// block refers to the first's dynamic table entries (the authority among
/// them) by index.
fn kubelet_connection() -> (Vec<u8>, Vec<Vec<(String, String)>>) {
    let mut encoder = GoLikeEncoder::new();
    let first = request("/pluginregistration.Registration/GetInfo");
    let second = request("/pluginregistration.Registration/NotifyRegistrationStatus");
    let block1 = encoder.encode(&first);
    let block2 = encoder.encode(&second);
    let coded = huffman(KUBELET_AUTHORITY.as_bytes());
    let names_it = |block: &[u8]| block.windows(coded.len()).any(|w| w == coded);
    assert!(
        names_it(&block1),
        "the first block spells the authority out"
    );
    assert!(
        !names_it(&block2),
        "the second block names the authority by its dynamic table index: {block2:02x?}"
    );
    let mut input = PREFACE.to_vec();
    input.extend(frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]));
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block1));
    input.extend(frame(DATA, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0]));
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &block2));
    input.extend(frame(DATA, FLAG_END_STREAM, 3, &[0, 0, 0, 0, 2, 8, 1]));
    (input, vec![with_localhost(&first), with_localhost(&second)])
}

#[test]
fn grpc_go_blocks_sharing_the_dynamic_table_name_localhost() {
    let (input, want) = kubelet_connection();
    let out = rewrite(&input).expect("rewritten");
    let frames = parse_frames(&out);
    let headers: Vec<&Frame> = frames.iter().filter(|f| f.kind == TYPE_HEADERS).collect();
    assert_eq!(headers.len(), 2);
    for (frame, want) in headers.iter().zip(&want) {
        assert_eq!(frame.flags, FLAG_END_HEADERS);
        assert_eq!(&fields_of(&frame.payload), want);
    }
    assert_eq!(
        frames
            .iter()
            .map(|f| (f.kind, f.stream))
            .collect::<Vec<_>>(),
        [
            (SETTINGS, 0),
            (TYPE_HEADERS, 1),
            (DATA, 1),
            (TYPE_HEADERS, 3),
            (DATA, 3)
        ]
    );
}

/// RFC 7541, Appendix C.4: three requests with Huffman coding, the later
/// ones using the dynamic table the first ones filled.
#[test]
fn rfc_7541_huffman_requests_on_one_connection() {
    let blocks: [&[u8]; 3] = [
        &[
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
            0x90, 0xf4, 0xff,
        ],
        &[
            0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
        ],
        &[
            0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f,
            0x89, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
        ],
    ];
    let want = [
        with_localhost(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]),
        with_localhost(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ]),
        with_localhost(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]),
    ];
    let mut input = PREFACE.to_vec();
    for (i, block) in blocks.iter().enumerate() {
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            2 * i as u32 + 1,
            block,
        ));
    }
    let frames = parse_frames(&rewrite(&input).expect("rewritten"));
    assert_eq!(frames.len(), 3);
    for (frame, want) in frames.iter().zip(&want) {
        assert_eq!(frame.flags, FLAG_END_HEADERS | FLAG_END_STREAM);
        assert_eq!(&fields_of(&frame.payload), want);
    }
}

#[test]
fn input_split_at_every_offset_gives_the_same_output() {
    let (mut input, _) = kubelet_connection();
    // A third block in a HEADERS and two CONTINUATIONs, padded, with a
    // priority.
    let block = GoLikeEncoder::new().encode(&request("/x"));
    let (a, rest) = block.split_at(7);
    let (b, c) = rest.split_at(20);
    let mut headers = vec![3];
    headers.extend([0, 0, 0, 1, 15]);
    headers.extend(a);
    headers.extend([0, 0, 0]);
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY,
        5,
        &headers,
    ));
    input.extend(frame(TYPE_CONTINUATION, 0, 5, b));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 5, c));
    let whole = rewrite(&input).expect("rewritten");
    for at in 0..=input.len() {
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        rewriter.feed(&input[..at], &mut out).expect("first part");
        rewriter.feed(&input[at..], &mut out).expect("second part");
        assert_eq!(out, whole, "split at {at}");
    }
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    for byte in &input {
        rewriter
            .feed(std::slice::from_ref(byte), &mut out)
            .expect("a byte");
    }
    assert_eq!(out, whole, "one byte at a time");
}

#[test]
fn continuation_padding_and_priority() {
    let fields = request("/pluginregistration.Registration/GetInfo");
    let block = GoLikeEncoder::new().encode(&fields);
    let (a, b) = block.split_at(10);
    let mut headers = vec![4];
    headers.extend([0x80, 0, 0, 3, 200]);
    headers.extend(a);
    headers.extend([0; 4]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
        7,
        &headers,
    ));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 7, b));
    let frames = parse_frames(&rewrite(&input).expect("rewritten"));
    assert_eq!(frames.len(), 1, "one HEADERS frame: {frames:?}");
    let f = &frames[0];
    assert_eq!((f.kind, f.stream), (TYPE_HEADERS, 7));
    assert_eq!(
        f.flags,
        FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS,
        "priority and end of stream kept, padding dropped"
    );
    assert_eq!(f.payload[..5], [0x80, 0, 0, 3, 200], "the priority as sent");
    assert_eq!(fields_of(&f.payload[5..]), with_localhost(&fields));
}

#[test]
fn a_block_larger_than_a_frame_continues() {
    let big = "v".repeat(40_000);
    let fields = [(":authority", "a%2Fb"), ("x-big", big.as_str())];
    let block = GoLikeEncoder::new().encode(&fields);
    let mut input = PREFACE.to_vec();
    // Sent in three frames as a client with a larger frame size would.
    let (a, rest) = block.split_at(16_000);
    let (b, c) = rest.split_at(16_000);
    input.extend(frame(TYPE_HEADERS, 0, 1, a));
    input.extend(frame(TYPE_CONTINUATION, 0, 1, b));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, c));
    let frames = parse_frames(&rewrite(&input).expect("rewritten"));
    let kinds: Vec<(u8, u8, usize)> = frames
        .iter()
        .map(|f| (f.kind, f.flags, f.payload.len()))
        .collect();
    let total: usize = frames.iter().map(|f| f.payload.len()).sum();
    assert_eq!(
        kinds,
        [
            (TYPE_HEADERS, 0, MAX_FRAME_PAYLOAD),
            (TYPE_CONTINUATION, 0, MAX_FRAME_PAYLOAD),
            (
                TYPE_CONTINUATION,
                FLAG_END_HEADERS,
                total - 2 * MAX_FRAME_PAYLOAD
            ),
        ]
    );
    let joined: Vec<u8> = frames.iter().flat_map(|f| f.payload.clone()).collect();
    assert_eq!(
        fields_of(&joined),
        owned(&[(":authority", "localhost"), ("x-big", big.as_str())])
    );
}

#[test]
fn other_frames_pass_byte_identical() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0x10, 0, 0]));
    input.extend(frame(SETTINGS, 1, 0, &[]));
    input.extend(frame(0x8, 0, 0, &[0, 0x0f, 0, 0])); // WINDOW_UPDATE
    input.extend(frame(0x6, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8])); // PING
    input.extend(frame(DATA, FLAG_PADDED, 1, &[2, 0xaa, 0xbb, 0, 0]));
    input.extend(frame(0x3, 0, 1, &[0, 0, 0, 8])); // RST_STREAM
    input.extend(frame(0xfa, 0xff, 9, &[1; 300])); // an unknown type
    input.extend(frame(0x7, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0])); // GOAWAY
    assert_eq!(rewrite(&input).expect("passed"), input);
}

#[test]
fn malformed_input_is_refused() {
    let block = GoLikeEncoder::new().encode(&request("/p"));
    let with = |frames: &[Vec<u8>]| {
        let mut input = PREFACE.to_vec();
        for f in frames {
            input.extend(f);
        }
        input
    };
    // A HEADERS frame with END_HEADERS on stream 1.
    let one_block = |flags: u8, payload: &[u8]| {
        with(&[frame(TYPE_HEADERS, FLAG_END_HEADERS | flags, 1, payload)])
    };
    let cases: Vec<(&str, Vec<u8>, RewriteError)> = vec![
        (
            "HTTP/1.1",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            RewriteError::Preface,
        ),
        (
            "headers on stream 0",
            with(&[frame(TYPE_HEADERS, FLAG_END_HEADERS, 0, &block)]),
            RewriteError::StreamZero,
        ),
        (
            "padding longer than the frame",
            one_block(FLAG_PADDED, &[9, 0x82]),
            RewriteError::BadPadding(2),
        ),
        (
            "padded without its length",
            one_block(FLAG_PADDED, &[]),
            RewriteError::BadPadding(0),
        ),
        (
            "priority cut short",
            one_block(FLAG_PRIORITY, &[0, 0]),
            RewriteError::BadPadding(2),
        ),
        (
            "a DATA frame inside a header block",
            with(&[
                frame(TYPE_HEADERS, 0, 1, &block[..4]),
                frame(DATA, 0, 1, &[]),
            ]),
            RewriteError::Interleaved {
                kind: DATA,
                stream: 1,
                open: 1,
            },
        ),
        (
            "a CONTINUATION of another stream",
            with(&[
                frame(TYPE_HEADERS, 0, 1, &block[..4]),
                frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &block[4..]),
            ]),
            RewriteError::Interleaved {
                kind: TYPE_CONTINUATION,
                stream: 3,
                open: 1,
            },
        ),
        (
            "a CONTINUATION without HEADERS",
            with(&[frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &block)]),
            RewriteError::StrayContinuation(1),
        ),
        (
            "an index past both tables",
            one_block(0, &[0xbe]),
            RewriteError::Hpack {
                stream: 1,
                source: DecoderError::HeaderIndexOutOfBounds,
            },
        ),
        (
            "a dynamic table larger than the server allows",
            // A size update to 8192, then :method GET.
            one_block(0, &[0x3f, 0xe1, 0x3f, 0x82]),
            RewriteError::Hpack {
                stream: 1,
                source: DecoderError::InvalidMaxDynamicSize,
            },
        ),
    ];
    for (what, input, want) in cases {
        assert_eq!(rewrite(&input), Err(want), "{what}");
    }
    // A block that would exceed the limit is refused from its frame
    // header, before its payload arrives.
    let mut huge = PREFACE.to_vec();
    write_frame_header(MAX_HEADER_BLOCK + 1, TYPE_HEADERS, 0, 1, &mut huge);
    assert_eq!(rewrite(&huge), Err(RewriteError::TooLarge(1)));
}

#[tokio::test]
async fn the_connection_fails_after_a_malformed_frame() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (client, server) = tokio::io::duplex(1024);
    let mut server = AuthorityRewrite::new(server);
    let mut client = client;
    let mut input = PREFACE.to_vec();
    input.extend(frame(SETTINGS, 0, 0, &[]));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82]));
    client.write_all(&input).await.expect("written");
    let mut got = Vec::new();
    let error = server
        .read_to_end(&mut got)
        .await
        .expect_err("the read fails");
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    assert_eq!(got, input[..PREFACE.len() + 9], "what came before passed");
    // Writes go through untouched.
    server.write_all(b"server bytes").await.expect("write");
    let mut buf = [0; 12];
    client.read_exact(&mut buf).await.expect("read");
    assert_eq!(&buf, b"server bytes");
}

#[test]
fn integers_round_trip_through_the_decoder() {
    for value in [0, 1, 30, 31, 126, 127, 128, 255, 1337, 16_384, 1 << 20] {
        let mut block = Vec::new();
        // A literal without indexing, new name, of `value` bytes.
        block.push(0);
        encode_integer(1, 7, 0, &mut block);
        block.push(b'n');
        encode_integer(value, 7, 0, &mut block);
        block.extend(std::iter::repeat_n(b'x', value));
        let fields = Decoder::new().decode(&block).expect("decodes");
        assert_eq!(fields[0].1.len(), value, "{value}");
    }
}
