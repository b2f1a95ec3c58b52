//! Reading one Arrow table of a response, and its header, without
//! copying: every byte came from another process and is treated as
//! hostile (offsets bounds-checked, the IPC stream decoded by arrow-rs with
//! alignment required, the schema exactly the documented one). The
//! one-type reader ([`crate::payload::reader`]) and the typed one
//! ([`crate::payload::typed`]) read their tables through it.

use std::mem::size_of;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MessageHeader, MetadataVersion};
use arrow_schema::ArrowError;

use crate::layout::{status, ResponseHeader, MESSAGE_BYTES};
use crate::payload::writer::CachedSchema;

/// Why a response could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("sidecar answered {status_name} ({status}): {message}")]
    Status {
        status: u32,
        status_name: &'static str,
        message: String,
    },
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("malformed response: {table} table: {source}")]
    Arrow {
        table: &'static str,
        #[source]
        source: ArrowError,
    },
}

/// Name of a response status code.
pub fn status_name(code: u32) -> &'static str {
    match code {
        status::OK => "OK",
        status::INVALID_REQUEST => "INVALID_REQUEST",
        status::TOO_LARGE => "TOO_LARGE",
        status::DEADLINE_EXCEEDED => "DEADLINE_EXCEEDED",
        status::UNAVAILABLE => "UNAVAILABLE",
        status::INTERNAL => "INTERNAL",
        _ => "UNKNOWN_STATUS",
    }
}

/// Reads the response header at the start of `area`.
pub fn read_header(area: &[u8]) -> Result<ResponseHeader, DecodeError> {
    let bytes = area
        .get(..size_of::<ResponseHeader>())
        .ok_or_else(|| DecodeError::Malformed("response area smaller than its header".into()))?;
    Ok(bytemuck::pod_read_unaligned(bytes))
}

/// The header of an OK response in a 64-byte aligned `area`; a non-OK
/// status is the error, with its message.
pub(crate) fn read_ok_header(area: &Buffer) -> Result<ResponseHeader, DecodeError> {
    if !(area.as_ptr() as usize).is_multiple_of(64) {
        return Err(DecodeError::Malformed(
            "response area is not 64-byte aligned".into(),
        ));
    }
    let header = read_header(area.as_slice())?;
    if header.status != status::OK {
        return Err(DecodeError::Status {
            status: header.status,
            status_name: status_name(header.status),
            message: header_message(&header),
        });
    }
    Ok(header)
}

/// The human-readable message of a response header (lossy UTF-8).
pub fn header_message(header: &ResponseHeader) -> String {
    let len = (header.message_len as usize).min(MESSAGE_BYTES);
    String::from_utf8_lossy(&header.message[..len]).into_owned()
}

pub(crate) fn decode_table(
    area: &Buffer,
    table: &'static str,
    offset: u64,
    len: u64,
    expected: &CachedSchema,
) -> Result<RecordBatch, DecodeError> {
    let header_len = size_of::<ResponseHeader>() as u64;
    let end = offset.checked_add(len);
    if offset < header_len
        || !offset.is_multiple_of(64)
        || end.is_none_or(|e| e > area.len() as u64)
    {
        return Err(DecodeError::Malformed(format!(
            "{table} table at {offset}+{len} is not a 64-aligned range inside the {} byte \
             response area after its header",
            area.len()
        )));
    }
    let stream = area.slice_with_length(offset as usize, len as usize);
    let frame = frame_table(stream.as_slice(), &expected.message)
        .and_then(|frame| {
            buffer_shapes(&expected.schema, &frame.node_lengths, &frame.buffer_lengths)?;
            Ok(frame)
        })
        .map_err(|reason| DecodeError::Malformed(format!("{table} table: {reason}")))?;
    // Defence in depth: the framing check rules out the inputs known to make
    // arrow-rs panic (buffers past the body); should another one exist, a
    // hostile peer must still only cause an error.
    let batch = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if frame.known_schema {
            decode_known_schema(&stream, &frame, expected, table)
        } else {
            decode_other_schema_encoding(&stream, &frame, expected, table)
        }
    }))
    .map_err(|_| {
        DecodeError::Malformed(format!(
            "{table} table: the Arrow decoder rejected it (panicked)"
        ))
    })??;
    if batch.schema().fields() != expected.schema.fields() {
        return Err(DecodeError::Malformed(format!(
            "{table} table schema {:?} is not the documented {:?}",
            batch.schema().fields(),
            expected.schema.fields()
        )));
    }
    Ok(batch)
}

/// Where the messages of a table stream are.
#[derive(Debug)]
struct TableFrame {
    /// The schema message is byte-identical to the expected one.
    known_schema: bool,
    /// Otherwise, where the schema message's flatbuffer is in the stream.
    schema_meta: std::ops::Range<usize>,
    /// The record batch message: start, encapsulated metadata length
    /// (prefix included), body length.
    batch_start: usize,
    batch_meta_len: usize,
    batch_body_len: usize,
    /// The record batch's field node lengths and buffer lengths, in order.
    node_lengths: Vec<i64>,
    buffer_lengths: Vec<i64>,
}

/// Checks that a record batch has exactly the field nodes and buffers the
/// documented schema lays out (depth first: a validity buffer per field,
/// then a primitive's values, a list's i32 offsets and its child, a
/// fixed-size list's child), and that each buffer arrow-rs will view as a
/// typed slice holds whole values: a list's offsets `(rows + 1) x 4`
/// bytes at least, a primitive's a multiple of its width. arrow-rs asserts
/// these rather than returning an error.
fn buffer_shapes(
    schema: &arrow_schema::Schema,
    nodes: &[i64],
    buffers: &[i64],
) -> Result<(), String> {
    use arrow_schema::DataType;
    struct Walk<'a> {
        nodes: &'a [i64],
        buffers: &'a [i64],
        node: usize,
        buffer: usize,
    }
    impl Walk<'_> {
        fn next_node(&mut self) -> Result<i64, String> {
            let n = *self
                .nodes
                .get(self.node)
                .ok_or("fewer field nodes than the schema has fields")?;
            self.node += 1;
            Ok(n)
        }
        fn next_buffer(&mut self) -> Result<i64, String> {
            let b = *self
                .buffers
                .get(self.buffer)
                .ok_or("fewer buffers than the schema lays out")?;
            self.buffer += 1;
            Ok(b)
        }
        fn field(&mut self, data_type: &DataType) -> Result<(), String> {
            let rows = self.next_node()?;
            self.next_buffer()?; // validity
            match data_type {
                DataType::Boolean => {
                    self.next_buffer()?;
                }
                DataType::FixedSizeList(child, _) => self.field(child.data_type())?,
                DataType::List(child) => {
                    let offsets = self.next_buffer()?;
                    let needed = rows.saturating_add(1).saturating_mul(4);
                    if offsets % 4 != 0 || offsets < needed {
                        return Err(format!(
                            "a list's offsets buffer of {offsets} bytes for {rows} rows"
                        ));
                    }
                    self.field(child.data_type())?;
                }
                primitive => {
                    let width = primitive.primitive_width().unwrap_or(1) as i64;
                    let values = self.next_buffer()?;
                    if values % width != 0 {
                        return Err(format!(
                            "a {primitive} buffer of {values} bytes is not whole values"
                        ));
                    }
                }
            }
            Ok(())
        }
    }
    let mut walk = Walk {
        nodes,
        buffers,
        node: 0,
        buffer: 0,
    };
    for field in schema.fields() {
        walk.field(field.data_type())?;
    }
    if walk.node != nodes.len() || walk.buffer != buffers.len() {
        return Err(format!(
            "{} field nodes and {} buffers where the schema lays out {} and {}",
            nodes.len(),
            buffers.len(),
            walk.node,
            walk.buffer
        ));
    }
    Ok(())
}

/// The fast path: the schema message is byte-identical to the encoding of
/// the expected schema, so only the record batch is decoded, against the
/// cached schema (alignment still required).
fn decode_known_schema(
    stream: &Buffer,
    frame: &TableFrame,
    expected: &CachedSchema,
    table: &'static str,
) -> Result<RecordBatch, DecodeError> {
    let decoder =
        FileDecoder::new(expected.schema.clone(), MetadataVersion::V5).with_require_alignment(true);
    let block = Block::new(0, frame.batch_meta_len as i32, frame.batch_body_len as i64);
    let message = stream.slice_with_length(
        frame.batch_start,
        frame.batch_meta_len + frame.batch_body_len,
    );
    decoder
        .read_record_batch(&block, &message)
        .map_err(|source| DecodeError::Arrow { table, source })?
        .ok_or_else(|| DecodeError::Malformed(format!("{table} table holds no record batch")))
}

/// The general path: another encoding of the schema (another Arrow
/// library's). The schema message is decoded on its own and must describe
/// the documented schema; the record batch is then decoded against the
/// documented schema only, as on the fast path, so no column type the
/// protocol does not use ever reaches arrow-rs's decoders.
fn decode_other_schema_encoding(
    stream: &Buffer,
    frame: &TableFrame,
    expected: &CachedSchema,
    table: &'static str,
) -> Result<RecordBatch, DecodeError> {
    let message = arrow_ipc::root_as_message(&stream.as_slice()[frame.schema_meta.clone()])
        .map_err(|e| DecodeError::Malformed(format!("{table} table schema: {e}")))?;
    let schema = message
        .header_as_schema()
        .ok_or_else(|| DecodeError::Malformed(format!("{table} table has no schema")))
        .and_then(|fb| {
            arrow_ipc::convert::try_fb_to_schema(fb)
                .map_err(|source| DecodeError::Arrow { table, source })
        })?;
    if schema.fields() != expected.schema.fields() {
        return Err(DecodeError::Malformed(format!(
            "{table} table schema {:?} is not the documented {:?}",
            schema.fields(),
            expected.schema.fields()
        )));
    }
    decode_known_schema(stream, frame, expected, table)
}

/// Checks the framing of a table stream, which must be exactly: a schema
/// message, one record batch message and the end-of-stream marker. Checks
/// what arrow-rs trusts: each message's flatbuffer verifies, its body lies
/// inside the stream, every buffer of the batch lies inside the body on a
/// 64-byte boundary, nothing is compressed. A schema message identical to
/// `expected_schema` (our own encoding, known good) is not re-verified.
fn frame_table(stream: &[u8], expected_schema: &[u8]) -> Result<TableFrame, String> {
    let known_schema = stream.starts_with(expected_schema);
    let mut pos = 0usize;
    let mut schema_end = None;
    let mut schema_meta = 0..0;
    let mut batch = None;
    let mut node_lengths = Vec::new();
    let mut buffer_lengths = Vec::new();
    if known_schema {
        pos = expected_schema.len();
        schema_end = Some(pos);
    }
    loop {
        let prefix = stream
            .get(pos..pos + 8)
            .ok_or_else(|| format!("stream ends at byte {pos} without an end-of-stream marker"))?;
        if prefix[..4] != [0xFF; 4] {
            return Err(format!("no continuation marker at byte {pos}"));
        }
        let meta_len = i32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes"));
        if meta_len == 0 {
            if pos + 8 != stream.len() {
                return Err("bytes after the end-of-stream marker".into());
            }
            break;
        }
        let meta_len =
            usize::try_from(meta_len).map_err(|_| "negative metadata length".to_string())?;
        let meta_start = pos + 8;
        let meta = meta_start
            .checked_add(meta_len)
            .and_then(|end| stream.get(meta_start..end))
            .ok_or_else(|| format!("message metadata at byte {pos} runs past the stream"))?;
        let message = arrow_ipc::root_as_message(meta)
            .map_err(|e| format!("message at byte {pos} is not a valid flatbuffer: {e}"))?;
        let body_len = usize::try_from(message.bodyLength())
            .map_err(|_| format!("negative body length at byte {pos}"))?;
        let body_start = meta_start + meta_len;
        // The IPC format pads every message to 8 bytes; a body that starts
        // elsewhere would hand arrow-rs misaligned buffers (a panic).
        if !body_start.is_multiple_of(8) {
            return Err(format!(
                "message body at byte {body_start} is not 8-byte aligned"
            ));
        }
        let body_end = body_start
            .checked_add(body_len)
            .filter(|&end| end <= stream.len())
            .ok_or_else(|| format!("message body at byte {body_start} runs past the stream"))?;
        match (message.header_type(), schema_end, batch.is_some()) {
            (MessageHeader::Schema, None, false) if body_len == 0 => {
                schema_end = Some(body_end);
                schema_meta = meta_start..meta_start + meta_len;
            }
            (MessageHeader::RecordBatch, Some(_), false) => {
                let record_batch = message
                    .header_as_record_batch()
                    .ok_or("record batch message without a record batch")?;
                if record_batch.compression().is_some() {
                    return Err("compressed record batches are not part of the protocol".into());
                }
                // Every column of the protocol's tables has a buffer, so no
                // row count can exceed the body's bits; a larger one would
                // only make arrow-rs's size arithmetic overflow (a panic).
                let max_rows = (body_len as u64).saturating_mul(8);
                let counts = std::iter::once(record_batch.length()).chain(
                    record_batch
                        .nodes()
                        .into_iter()
                        .flatten()
                        .flat_map(|node| [node.length(), node.null_count()]),
                );
                for count in counts {
                    if u64::try_from(count).map_or(true, |n| n > max_rows) {
                        return Err(format!(
                            "a row count of {count} cannot fit the {body_len} byte body"
                        ));
                    }
                }
                for buffer in record_batch.buffers().into_iter().flatten() {
                    let inside = u64::try_from(buffer.offset())
                        .ok()
                        .filter(|o| o % 64 == 0)
                        .zip(u64::try_from(buffer.length()).ok())
                        .and_then(|(o, l)| o.checked_add(l))
                        .is_some_and(|end| end <= body_len as u64);
                    if !inside {
                        return Err(format!(
                            "buffer at {}+{} is not 64-aligned inside the {body_len} byte body",
                            buffer.offset(),
                            buffer.length()
                        ));
                    }
                }
                node_lengths = record_batch
                    .nodes()
                    .into_iter()
                    .flatten()
                    .map(|node| node.length())
                    .collect();
                buffer_lengths = record_batch
                    .buffers()
                    .into_iter()
                    .flatten()
                    .map(|buffer| buffer.length())
                    .collect();
                batch = Some((pos, 8 + meta_len, body_len));
            }
            (kind, _, _) => {
                return Err(format!(
                    "unexpected {kind:?} message at byte {pos}: a table is one schema message, \
                     one record batch and the end-of-stream marker"
                ))
            }
        }
        pos = body_end;
    }
    let (Some(_), Some((batch_start, batch_meta_len, batch_body_len))) = (schema_end, batch) else {
        return Err("a table needs a schema message and a record batch".into());
    };
    Ok(TableFrame {
        known_schema,
        schema_meta,
        batch_start,
        batch_meta_len,
        batch_body_len,
        node_lengths,
        buffer_lengths,
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use arrow_buffer::MutableBuffer;

    use super::*;
    use crate::payload::{PayloadShape, ResponseWriter, SchemaCache};

    /// A table whose schema message is not byte-identical to ours (another
    /// Arrow library's encoding) takes the general path: its schema is
    /// checked on its own, and the batch decodes as on the fast path.
    #[test]
    fn another_encoding_of_the_schema_is_checked_then_decoded_as_documented() {
        let cache = SchemaCache::default();
        let mut area = MutableBuffer::from_len_zeroed(8192);
        let shape = PayloadShape {
            n_targets: 1,
            n_nodes: 2,
            feature_dim: 4,
            fanouts: [1, 1],
        };
        let mut writer = ResponseWriter::new(area.as_slice_mut(), shape, &cache).unwrap();
        {
            let (nodes, targets) = writer.columns();
            nodes.node_id.copy_from_slice(&[5, 9]);
            nodes
                .features
                .copy_from_slice(&[1., 2., 3., 4., 5., 6., 7., 8.]);
            targets.target_row[0] = 0;
            targets.hop1_count[0] = 1;
            targets.hop1_rows[0] = 1;
        }
        writer.finish(1, 1, 0);
        let area: Buffer = area.into();
        let word = |at: usize| u64::from_le_bytes(area.as_slice()[at..at + 8].try_into().unwrap());
        let (offset, len) = (word(40) as usize, word(48) as usize);
        let stream = area.slice_with_length(offset, len);
        let expected = cache.node(4);
        let fast = frame_table(stream.as_slice(), &expected.message).unwrap();
        assert!(fast.known_schema);
        let fast = decode_known_schema(&stream, &fast, &expected, "node").unwrap();
        // Framed as if the schema bytes were someone else's.
        let general = frame_table(stream.as_slice(), b"another encoding").unwrap();
        assert!(!general.known_schema && !general.schema_meta.is_empty());
        let decoded = decode_other_schema_encoding(&stream, &general, &expected, "node").unwrap();
        assert_eq!(decoded, fast);
        // A schema that is not the documented one is refused before the
        // batch is decoded.
        let other = cache.node(3);
        let err = decode_other_schema_encoding(&stream, &general, &other, "node").unwrap_err();
        assert!(err.to_string().contains("not the documented"), "{err}");
    }
}
