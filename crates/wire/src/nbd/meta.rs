//! Metadata context negotiation: the data of `OPT_LIST_META_CONTEXT` and
//! `OPT_SET_META_CONTEXT`, and the `NBD_REP_META_CONTEXT` reply.
//!
//! ```text
//! C: name length u32 | name | query count u32 | count x (query length u32 | query)
//! S: REP_META_CONTEXT: context id u32 | context name
//! ```

use super::error::need;
use super::{be_u32, DecodeError, META_QUERIES_MAX, STRING_BYTES_MAX};

/// Which export, and which contexts to list or select.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    pub name: &'a [u8],
    /// Queries as sent: `base:allocation`, a namespace such as `base:`, or
    /// anything else (which matches nothing here).
    pub queries: Vec<&'a [u8]>,
}

impl<'a> MetaContextRequest<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let strings: usize = self.queries.iter().map(|q| 4 + q.len()).sum();
        let mut b = Vec::with_capacity(8 + self.name.len() + strings);
        b.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        b.extend_from_slice(self.name);
        b.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q);
        }
        b
    }

    /// Decode the whole option data `b`; its length must match exactly.
    /// Every count and string length is checked against its limit before
    /// it is used, so no claimed length reaches an allocation.
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        let (name, mut at) = string_at(b, 0, "export name")?;
        need("meta context request", b, at + 4)?;
        let count = be_u32(b, at);
        if count > META_QUERIES_MAX {
            let (got, limit) = (count as u64, META_QUERIES_MAX as u64);
            return Err(DecodeError::TooLong { what: "meta context query count", got, limit });
        }
        at += 4;
        let mut queries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let (q, next) = string_at(b, at, "meta context query")?;
            queries.push(q);
            at = next;
        }
        if b.len() != at {
            let (got, expected) = (b.len() as u64, at as u64);
            return Err(DecodeError::BadLength { what: "meta context request", got, expected });
        }
        Ok(MetaContextRequest { name, queries })
    }
}

/// The length-prefixed string at `at`, and where the next field starts.
fn string_at<'a>(
    b: &'a [u8],
    at: usize,
    what: &'static str,
) -> Result<(&'a [u8], usize), DecodeError> {
    need(what, b, at + 4)?;
    let len = be_u32(b, at) as u64;
    if len > STRING_BYTES_MAX as u64 {
        return Err(DecodeError::TooLong { what, got: len, limit: STRING_BYTES_MAX as u64 });
    }
    let end = at + 4 + len as usize;
    need(what, b, end)?;
    Ok((&b[at + 4..end], end))
}

/// The `NBD_REP_META_CONTEXT` payload: a context's id and name.
pub fn encode_rep_meta_context(id: u32, name: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(name);
    b
}

/// Split an `NBD_REP_META_CONTEXT` payload into id and name.
pub fn decode_rep_meta_context(b: &[u8]) -> Result<(u32, &[u8]), DecodeError> {
    need("meta context reply", b, 4)?;
    Ok((be_u32(b, 0), &b[4..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_round_trips(
            name in proptest::collection::vec(any::<u8>(), 0..300),
            queries in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..10),
        ) {
            let r = MetaContextRequest {
                name: &name,
                queries: queries.iter().map(|q| &q[..]).collect(),
            };
            let b = r.encode();
            prop_assert_eq!(MetaContextRequest::decode(&b).unwrap(), r);
        }

        #[test]
        fn a_request_with_a_wrong_length_is_refused(
            name in proptest::collection::vec(any::<u8>(), 0..30),
            extra in 1usize..4,
        ) {
            let queries: Vec<&[u8]> = vec![b"base:allocation", b"base:"];
            let mut b = MetaContextRequest { name: &name, queries }.encode();
            b.extend(std::iter::repeat_n(0u8, extra));
            prop_assert!(MetaContextRequest::decode(&b).is_err());
            b.truncate(b.len() - extra - 1);
            prop_assert!(MetaContextRequest::decode(&b).is_err());
        }

        #[test]
        fn rep_meta_context_round_trips(id in any::<u32>(),
                                        name in proptest::collection::vec(any::<u8>(), 0..64)) {
            let b = encode_rep_meta_context(id, &name);
            prop_assert_eq!(decode_rep_meta_context(&b).unwrap(), (id, &name[..]));
        }
    }

    #[test]
    fn counts_and_lengths_over_their_limits_are_refused_before_use() {
        // A query count of 4 billion, with nothing behind it.
        let mut b = vec![0, 0, 0, 0];
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(MetaContextRequest::decode(&b), Err(DecodeError::TooLong { .. })));
        // One query more than the limit, each of them empty.
        let mut b = vec![0, 0, 0, 0];
        b.extend_from_slice(&(META_QUERIES_MAX + 1).to_be_bytes());
        b.extend(std::iter::repeat_n(0u8, 4 * (META_QUERIES_MAX as usize + 1)));
        assert!(matches!(MetaContextRequest::decode(&b), Err(DecodeError::TooLong { .. })));
        // A query longer than a protocol string may be.
        let mut b = vec![0, 0, 0, 0, 0, 0, 0, 1];
        b.extend_from_slice(&(STRING_BYTES_MAX as u32 + 1).to_be_bytes());
        b.extend(std::iter::repeat_n(b'a', STRING_BYTES_MAX + 1));
        assert!(matches!(MetaContextRequest::decode(&b), Err(DecodeError::TooLong { .. })));
        // A name longer than the data, and no data at all.
        assert!(MetaContextRequest::decode(&[0, 0, 0, 9, b'a']).is_err());
        assert!(MetaContextRequest::decode(&[]).is_err());
        assert!(decode_rep_meta_context(&[0, 0, 1]).is_err());
    }

    #[test]
    fn the_limit_itself_is_accepted() {
        let q = vec![b'q'; STRING_BYTES_MAX];
        let queries = vec![&q[..]; META_QUERIES_MAX as usize];
        let r = MetaContextRequest { name: b"mem", queries };
        let b = r.encode();
        assert_eq!(MetaContextRequest::decode(&b).unwrap(), r);
    }
}
