//! The payload of RPC_BEGIN and RPC_END records: one part of one ggml-rpc command, and the
//! command names by byte.

use serde::{Deserialize, Serialize};

/// Which end of a ggml-rpc command an RPC record describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RpcPart {
    /// The client sends the command: from its command byte to the end of its payload.
    #[default]
    Request,
    /// The client reads the answer: from when it starts waiting to the answer's last byte.
    Answer,
    /// The server serves the command: from its command byte to when it waits for the next.
    Serve,
}

/// The payload of an RPC_BEGIN or RPC_END record: one part of one ggml-rpc command, on the
/// record's thread. Commands on a connection are numbered in order (`index`, from the HELLO
/// that opens it at 0): a client's request, its answer and the server's serving of it share
/// their connection's order, which is how the two ends' traces are joined.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RpcBoundary {
    pub part: RpcPart,
    /// The command byte (`enum rpc_cmd`; [`rpc_command_name`]).
    pub command: u8,
    /// The connection, numbered from 1 in this process.
    pub connection: u32,
    /// The command's place on its connection (HELLO: 0).
    pub index: u32,
    /// The far end as the client named it (`host:port`), or the address the server listens on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// RPC_END: bytes this part sent (command byte, size and payload; an answer's size and
    /// payload).
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub sent: u64,
    /// RPC_END: bytes this part received.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub received: u64,
}

impl RpcBoundary {
    /// Parses an RPC record's payload: the writer's own form (its fields in order, no spaces or
    /// escapes) read directly, anything else through serde (RPC records are most of a ggml-rpc
    /// trace, and serde's path costs several times as much).
    pub fn from_json(label: &[u8]) -> Option<RpcBoundary> {
        Self::from_writers_json(label).or_else(|| serde_json::from_slice(label).ok())
    }

    fn from_writers_json(label: &[u8]) -> Option<RpcBoundary> {
        let mut rest = label.strip_prefix(b"{\"part\":\"")?;
        let part = if let Some(r) = rest.strip_prefix(b"request\"") {
            rest = r;
            RpcPart::Request
        } else if let Some(r) = rest.strip_prefix(b"answer\"") {
            rest = r;
            RpcPart::Answer
        } else {
            rest = rest.strip_prefix(b"serve\"")?;
            RpcPart::Serve
        };
        let mut out = RpcBoundary {
            part,
            ..RpcBoundary::default()
        };
        let number = |rest: &mut &[u8], key: &[u8]| -> Option<u64> {
            *rest = rest.strip_prefix(key)?;
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits > 1 && rest[0] == b'0' {
                return None; // not JSON: serde refuses it too
            }
            let n = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
            *rest = &rest[digits..];
            Some(n)
        };
        out.command = u8::try_from(number(&mut rest, b",\"command\":")?).ok()?;
        out.connection = u32::try_from(number(&mut rest, b",\"connection\":")?).ok()?;
        out.index = u32::try_from(number(&mut rest, b",\"index\":")?).ok()?;
        if let Some(r) = rest.strip_prefix(b",\"endpoint\":\"") {
            let len = r
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
            if r[len] != b'"' {
                return None; // an escape (serde's to read) or a control byte (not JSON)
            }
            out.endpoint = Some(std::str::from_utf8(&r[..len]).ok()?.to_owned());
            rest = &r[len + 1..];
        }
        if rest.starts_with(b",\"sent\":") {
            out.sent = number(&mut rest, b",\"sent\":")?;
        }
        if rest.starts_with(b",\"received\":") {
            out.received = number(&mut rest, b",\"received\":")?;
        }
        (rest == b"}").then_some(out)
    }
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// ggml-rpc's command names by command byte (`enum rpc_cmd` in `ggml-rpc.cpp`, protocol 7.0;
/// HELLO is 14 in every version). Codes past the table are named by number.
pub fn rpc_command_name(code: u8) -> std::borrow::Cow<'static, str> {
    const NAMES: [&str; 18] = [
        "ALLOC_BUFFER",
        "GET_ALIGNMENT",
        "GET_MAX_SIZE",
        "BUFFER_GET_BASE",
        "FREE_BUFFER",
        "BUFFER_CLEAR",
        "SET_TENSOR",
        "SET_TENSOR_HASH",
        "GET_TENSOR",
        "COPY_TENSOR",
        "GRAPH_COMPUTE",
        "GET_DEVICE_MEMORY",
        "INIT_TENSOR",
        "GET_ALLOC_SIZE",
        "HELLO",
        "DEVICE_COUNT",
        "GRAPH_RECOMPUTE",
        "MEMSET_TENSOR",
    ];
    match NAMES.get(code as usize) {
        Some(name) => (*name).into(),
        None => format!("RPC_CMD_{code}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
    /// The direct reading of an RPC payload gives what serde gives, for the writer's form
    /// (endpoints that need escaping included) and for bytes a little off it (spaces, a
    /// leading zero, a field cut or doubled), where both must agree, refusal included.
    #[test]
    fn rpc_payloads_read_as_serde_reads_them(
        part in prop_oneof![Just(RpcPart::Request), Just(RpcPart::Answer), Just(RpcPart::Serve)],
        command in any::<u8>(),
        connection in any::<u32>(),
        index in any::<u32>(),
        endpoint in proptest::option::of(".{0,12}"),
        sent in prop_oneof![Just(0u64), any::<u64>()],
        received in prop_oneof![Just(0u64), any::<u64>()],
        cut in 0usize..200,
        insert in prop_oneof![Just(""), Just(" "), Just("0"), Just("\"\\u0041\""), Just(",\"sent\":1")],
    ) {
        let b = RpcBoundary { part, command, connection, index, endpoint, sent, received };
        let json = serde_json::to_vec(&b).unwrap();
        prop_assert_eq!(RpcBoundary::from_json(&json), Some(b));
        let mut bent = json.clone();
        let at = cut.min(bent.len());
        bent.splice(at..at, insert.bytes());
        prop_assert_eq!(RpcBoundary::from_json(&bent), serde_json::from_slice::<RpcBoundary>(&bent).ok());
        prop_assert_eq!(RpcBoundary::from_json(&json[..at]), serde_json::from_slice::<RpcBoundary>(&json[..at]).ok());
    }
    }
}
