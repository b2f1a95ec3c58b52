//! Where every Arrow buffer of a table goes, and the IPC messages that
//! describe them.
//!
//! A table is one complete Arrow IPC *stream*:
//! `schema message | record batch message | body | end-of-stream marker`.
//! Every message is encapsulated as `0xFFFFFFFF, i32 metadata length,
//! flatbuffer, zero padding`, padded so that what follows starts on a 64-byte
//! boundary; every body buffer starts on a 64-byte boundary of the body. The
//! body is planned first, so the sidecar can write column values straight
//! into their final place.

use std::ops::Range;

use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_ipc::{FieldNode, MessageBuilder, MessageHeader, MetadataVersion, RecordBatchBuilder};
use arrow_schema::Schema;

use crate::layout::BUFFER_ALIGN;

/// Physical shape of one column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColumnKind {
    /// A primitive of `width` bytes per row.
    Fixed { width: usize },
    /// A bit-packed boolean.
    Bool,
    /// A fixed-size list of `size` primitives of `width` bytes.
    List { width: usize, size: usize },
    /// A variable-size list (i32 offsets) of primitives of `width` bytes,
    /// `children` of them in all rows together.
    VarList { width: usize, children: usize },
}

/// Where a table's buffers are, relative to the start of its body.
#[derive(Debug, Clone)]
pub(crate) struct BodyPlan {
    pub rows: usize,
    pub nodes: Vec<FieldNode>,
    pub buffers: Vec<arrow_ipc::Buffer>,
    /// The values buffer of each column, in column order (a list's: its
    /// child's values).
    pub values: Vec<Range<usize>>,
    /// The offsets buffer of each variable-size list column (`None` for
    /// the other kinds), in column order.
    pub offsets: Vec<Option<Range<usize>>>,
    pub body_len: usize,
}

fn align64(n: usize) -> Option<usize> {
    n.checked_add(BUFFER_ALIGN - 1)
        .map(|n| n & !(BUFFER_ALIGN - 1))
}

/// Plans the body of a table with `rows` rows; `None` if a size overflows.
pub(crate) fn plan_body(rows: usize, columns: &[ColumnKind]) -> Option<BodyPlan> {
    let mut nodes = Vec::new();
    let mut buffers = Vec::new();
    let mut values = Vec::new();
    let mut offsets = Vec::new();
    let mut offset = 0usize;
    let rows_i64 = i64::try_from(rows).ok()?;
    // An empty validity buffer (no nulls) precedes every values buffer.
    let place = |len: usize,
                 offset: &mut usize,
                 buffers: &mut Vec<arrow_ipc::Buffer>|
     -> Option<Range<usize>> {
        buffers.push(arrow_ipc::Buffer::new(*offset as i64, 0));
        let range = *offset..offset.checked_add(len)?;
        buffers.push(arrow_ipc::Buffer::new(*offset as i64, len as i64));
        *offset = align64(range.end)?;
        Some(range)
    };
    for column in columns {
        nodes.push(FieldNode::new(rows_i64, 0));
        let mut list_offsets = None;
        let range = match *column {
            ColumnKind::Fixed { width } => {
                place(rows.checked_mul(width)?, &mut offset, &mut buffers)?
            }
            ColumnKind::Bool => place(rows.div_ceil(8), &mut offset, &mut buffers)?,
            ColumnKind::List { width, size } => {
                // The list's own validity buffer, then the child's node and buffers.
                buffers.push(arrow_ipc::Buffer::new(offset as i64, 0));
                let children = rows.checked_mul(size)?;
                nodes.push(FieldNode::new(i64::try_from(children).ok()?, 0));
                place(children.checked_mul(width)?, &mut offset, &mut buffers)?
            }
            ColumnKind::VarList { width, children } => {
                // The list's validity and i32 offsets, then the child's node
                // and buffers.
                let offsets_len = rows.checked_add(1)?.checked_mul(4)?;
                list_offsets = Some(place(offsets_len, &mut offset, &mut buffers)?);
                nodes.push(FieldNode::new(i64::try_from(children).ok()?, 0));
                place(children.checked_mul(width)?, &mut offset, &mut buffers)?
            }
        };
        values.push(range);
        offsets.push(list_offsets);
    }
    Some(BodyPlan {
        rows,
        nodes,
        buffers,
        values,
        offsets,
        body_len: offset,
    })
}

/// Encapsulates a flatbuffer message: continuation marker, length, message,
/// zero padding to a 64-byte boundary.
pub(crate) fn encapsulate(flatbuffer: &[u8]) -> Vec<u8> {
    let total = align64(8 + flatbuffer.len()).expect("message metadata is small");
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&0xFFFF_FFFFu32.to_le_bytes());
    out.extend_from_slice(&((total - 8) as i32).to_le_bytes());
    out.extend_from_slice(flatbuffer);
    out.resize(total, 0);
    out
}

/// The end-of-stream marker.
pub(crate) const END_OF_STREAM: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];

/// The encapsulated schema message of `schema`.
pub(crate) fn schema_message(schema: &Schema) -> Vec<u8> {
    let options = IpcWriteOptions::try_new(BUFFER_ALIGN, false, MetadataVersion::V5)
        .expect("64-byte alignment and V5 are valid options");
    let encoded = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
        schema,
        &mut DictionaryTracker::new(false),
        &options,
    );
    encapsulate(&encoded.ipc_message)
}

/// The encapsulated record batch message describing `plan`.
pub(crate) fn record_batch_message(plan: &BodyPlan) -> Vec<u8> {
    let mut fbb = flatbuffers::FlatBufferBuilder::with_capacity(512);
    let nodes = fbb.create_vector(&plan.nodes);
    let buffers = fbb.create_vector(&plan.buffers);
    let batch = {
        let mut builder = RecordBatchBuilder::new(&mut fbb);
        builder.add_length(plan.rows as i64);
        builder.add_nodes(nodes);
        builder.add_buffers(buffers);
        builder.finish()
    };
    let message = {
        let mut builder = MessageBuilder::new(&mut fbb);
        builder.add_version(MetadataVersion::V5);
        builder.add_header_type(MessageHeader::RecordBatch);
        builder.add_header(batch.as_union_value());
        builder.add_bodyLength(plan.body_len as i64);
        builder.finish()
    };
    fbb.finish(message, None);
    encapsulate(fbb.finished_data())
}
