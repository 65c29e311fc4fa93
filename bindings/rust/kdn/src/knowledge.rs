// SPDX-License-Identifier: Apache-2.0
//! Knowledge items: named documents whose KV is kept under position-free
//! content keys (`kdn_knowledge_*`).

use crate::error::{check, Result, Status};
use crate::model::{c_ids, KvResult, Model, TokenId};
use crate::runtime::c_string as c_chars_to_string;
use crate::types::{bytes, init, millis_ceil};
use crate::view::{KvView, KvViewMut};
use kdn_sys as sys;
use std::ptr;
use std::time::Duration;

/// A document's information (`kdn_document_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentInfo {
    /// Its id.
    pub doc_id: String,
    /// The version it was put with.
    pub version: u64,
    /// Its length in tokens.
    pub num_tokens: u64,
    /// Its chunks.
    pub chunks: u32,
    /// Chunks some tier holds now.
    pub chunks_present: u32,
    /// Pinned.
    pub pinned: bool,
    /// When it expires; `None`: never.
    pub expires_in: Option<Duration>,
    /// Chunks of it served (fetches, blends) since this version was put (since 1.4).
    pub hits: u64,
    /// Pinned with a TTL: when the pin ends; `None`: not pinned, or pinned
    /// until unpinned (since 1.4).
    pub pin_expires_in: Option<Duration>,
}

impl DocumentInfo {
    fn from_raw(d: &sys::kdn_document_info) -> Self {
        DocumentInfo {
            doc_id: c_chars_to_string(&d.doc_id),
            version: d.version,
            num_tokens: d.num_tokens,
            chunks: d.chunks,
            chunks_present: d.chunks_present,
            pinned: d.pinned != 0,
            expires_in: u64::try_from(d.expires_in_ms).ok().map(Duration::from_millis),
            hits: d.hits,
            pin_expires_in: u64::try_from(d.pin_expires_in_ms).ok().map(Duration::from_millis),
        }
    }
}

/// A model's documents in one namespace: [`Model::knowledge`].
///
/// ```
/// use kdn::{DType, KvView, KvViewMut, ModelSpec, Runtime, RuntimeOptions, Status};
/// let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(4))?;
/// let model = rt.model(&ModelSpec::new(1, 1, 2, DType::F32, "m"))?;
/// let docs = model.knowledge("tenant");
/// let tokens = [3, 1, 4, 1, 5, 9];
/// let kv: Vec<f32> = (0..6 * 2 * 2).map(|i| i as f32).collect();
/// docs.put("pi", 1, b"digits", &tokens, &KvView::canonical(&kv, DType::F32))?;
/// assert_eq!(docs.list()?[0].num_tokens, 6);
/// let (got_tokens, got_kv) = docs.fetch_to_vec("pi")?;
/// assert_eq!((got_tokens.as_slice(), kdn::as_bytes(&kv)), (&tokens[..], got_kv.as_slice()));
/// // too small: the error says how long the document is
/// let mut small = [0i32; 2];
/// let err = docs.fetch("pi", None, Some(&mut small)).unwrap_err();
/// assert_eq!((err.status(), err.needed()), (Status::BufferTooSmall, Some(6)));
/// # Ok::<(), kdn::Error>(())
/// ```
pub struct Knowledge<'m> {
    model: &'m Model,
    ns: &'m [u8],
}

/// A duration for C: whole milliseconds rounded up (a non-zero TTL never
/// becomes 0, "no TTL"), at most `i64::MAX`.
fn ms(d: Duration) -> i64 {
    millis_ceil(d, i64::MAX as u64) as i64
}

impl<'m> Knowledge<'m> {
    pub(crate) fn new(model: &'m Model, ns: &'m [u8]) -> Self {
        Knowledge { model, ns }
    }

    /// Stores a document: its tokens and their KV computed from position 0,
    /// replacing an older version of the same id (1..255 bytes). `Busy` when
    /// the runtime's index of documents is full. `tokens`: `i32` or `u32`
    /// ids ([`TokenId`]).
    pub fn put<T: TokenId>(
        &self,
        doc_id: &str,
        version: u64,
        metadata: &[u8],
        tokens: &[T],
        view: &KvView<'_>,
    ) -> Result<()> {
        self.put_views(doc_id, version, metadata, tokens, std::slice::from_ref(view))
    }

    /// [`put`](Self::put) from several views.
    pub fn put_views<T: TokenId>(
        &self,
        doc_id: &str,
        version: u64,
        metadata: &[u8],
        tokens: &[T],
        views: &[KvView<'_>],
    ) -> Result<()> {
        let tokens = c_ids(tokens)?;
        let raw: Vec<sys::kdn_kv_view> = views.iter().map(|v| v.parts.resolve(self.model)).collect::<Result<_>>()?;
        let (ns, ns_len) = bytes(self.ns);
        let (id, id_len) = bytes(doc_id.as_bytes());
        let (md, md_len) = bytes(metadata);
        // SAFETY: every pointer valid for the call; the views' memory is only read.
        check(unsafe {
            sys::kdn_knowledge_put(
                self.model.raw(),
                ns,
                ns_len,
                id,
                id_len,
                version,
                md,
                md_len,
                tokens.as_ptr(),
                tokens.len(),
                raw.as_ptr(),
                raw.len(),
            )
        })
    }

    /// One document's information; `NotFound` when there is no such document.
    pub fn info(&self, doc_id: &str) -> Result<DocumentInfo> {
        let mut out: sys::kdn_document_info = init(sys::kdn_document_info_init);
        let (ns, ns_len) = bytes(self.ns);
        let (id, id_len) = bytes(doc_id.as_bytes());
        // SAFETY: as above.
        check(unsafe { sys::kdn_knowledge_get_info(self.model.raw(), ns, ns_len, id, id_len, &mut out) })?;
        Ok(DocumentInfo::from_raw(&out))
    }

    /// Every document of the namespace, in id order.
    pub fn list(&self) -> Result<Vec<DocumentInfo>> {
        let (ns, ns_len) = bytes(self.ns);
        let mut count = 0usize;
        // SAFETY: capacity 0, no array: only the count.
        check(unsafe { sys::kdn_knowledge_list(self.model.raw(), ns, ns_len, ptr::null_mut(), 0, &mut count) })?;
        loop {
            let capacity = count + 4; // room for a few put meanwhile
            let mut out: Vec<sys::kdn_document_info> =
                (0..capacity).map(|_| init(sys::kdn_document_info_init)).collect();
            // SAFETY: room for `capacity` entries.
            check(unsafe {
                sys::kdn_knowledge_list(self.model.raw(), ns, ns_len, out.as_mut_ptr(), capacity, &mut count)
            })?;
            if count <= capacity {
                return Ok(out[..count].iter().map(DocumentInfo::from_raw).collect());
            }
        }
    }

    /// Pins every chunk of the document for `ttl` (`None`, or zero: until
    /// unpinned), rounded up to whole milliseconds.
    pub fn pin(&self, doc_id: &str, ttl: Option<Duration>) -> Result<()> {
        let (ns, ns_len) = bytes(self.ns);
        let (id, id_len) = bytes(doc_id.as_bytes());
        // SAFETY: as above.
        check(unsafe { sys::kdn_knowledge_pin(self.model.raw(), ns, ns_len, id, id_len, ttl.map_or(0, ms)) })
    }

    /// Unpins the document.
    pub fn unpin(&self, doc_id: &str) -> Result<()> {
        let (ns, ns_len) = bytes(self.ns);
        let (id, id_len) = bytes(doc_id.as_bytes());
        // SAFETY: as above.
        check(unsafe { sys::kdn_knowledge_unpin(self.model.raw(), ns, ns_len, id, id_len) })
    }

    /// Deletes the document `after` from now (zero: now), rounded up to
    /// whole milliseconds.
    pub fn expire(&self, doc_id: &str, after: Duration) -> Result<()> {
        let (ns, ns_len) = bytes(self.ns);
        let (id, id_len) = bytes(doc_id.as_bytes());
        // SAFETY: as above.
        check(unsafe { sys::kdn_knowledge_expire(self.model.raw(), ns, ns_len, id, id_len, ms(after)) })
    }

    /// Removes the document's chunks from every tier (chunks another
    /// document shares stay).
    pub fn delete(&self, doc_id: &str) -> Result<()> {
        let (ns, ns_len) = bytes(self.ns);
        let (id, id_len) = bytes(doc_id.as_bytes());
        // SAFETY: as above.
        check(unsafe { sys::kdn_knowledge_delete(self.model.raw(), ns, ns_len, id, id_len) })
    }

    /// Reads the document under one snapshot: its KV into `view` (if any;
    /// its room is `num_tokens`, or for a canonical view the whole buffer)
    /// and its tokens into `tokens` (if any). `tokens` of the result: the
    /// document's length. `BufferTooSmall`, with nothing written, when the
    /// view or `tokens` is shorter than the document: [`Error::needed`](crate::Error::needed) is
    /// its length. `NotFound` when there is no such document or its KV left
    /// every tier. The ids come back as the C ABI's `i32`s, each >= 0
    /// (`id as u32` is the tokenizer's id).
    pub fn fetch(
        &self,
        doc_id: &str,
        view: Option<&mut KvViewMut<'_>>,
        tokens: Option<&mut [i32]>,
    ) -> Result<KvResult> {
        let raw_view = match view {
            Some(v) => Some(v.parts.resolve_room(self.model)?),
            None => None,
        };
        let (views, num_views) = match &raw_view {
            Some(v) => (v as *const sys::kdn_kv_view, 1),
            None => (ptr::null(), 0),
        };
        let (tok, tok_cap) = match tokens {
            Some(t) => (t.as_mut_ptr(), t.len()),
            None => (ptr::null_mut(), 0),
        };
        let (ns, ns_len) = bytes(self.ns);
        let (id, id_len) = bytes(doc_id.as_bytes());
        let mut out: sys::kdn_kv_result = init(sys::kdn_kv_result_init);
        // SAFETY: the view's memory and `tokens` are exclusively borrowed for the call.
        let status = unsafe {
            sys::kdn_knowledge_fetch(self.model.raw(), ns, ns_len, id, id_len, views, num_views, tok, tok_cap, &mut out)
        };
        match check(status) {
            Err(e) if e.status() == Status::BufferTooSmall => Err(e.with_needed(out.tokens)),
            Err(e) => Err(e),
            Ok(()) => Ok(KvResult::from_raw(&out)),
        }
    }

    /// The document's tokens and its KV in the canonical layout (bytes), in
    /// buffers of its exact length.
    pub fn fetch_to_vec(&self, doc_id: &str) -> Result<(Vec<i32>, Vec<u8>)> {
        let mut n = self.info(doc_id)?.num_tokens;
        loop {
            let mut tokens = vec![0i32; n as usize];
            let mut kv = vec![0u8; (n * self.model.kv_bytes_per_token()) as usize];
            let result = {
                let mut view = KvViewMut::canonical(&mut kv, self.model.dtype());
                self.fetch(doc_id, Some(&mut view), Some(&mut tokens))
            };
            match result {
                Ok(r) if r.tokens == n => return Ok((tokens, kv)),
                // Put again meanwhile, shorter: the canonical layout depends on the length.
                Ok(r) => n = r.tokens,
                // Put again meanwhile, longer: try with its new length.
                Err(e) if e.status() == Status::BufferTooSmall && e.needed().unwrap_or(0) > n => {
                    n = e.needed().unwrap_or(0)
                }
                Err(e) => return Err(e),
            }
        }
    }
}
