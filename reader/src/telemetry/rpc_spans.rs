//! What the spans of ggml-rpc commands carry in the model: their category and the keys of their
//! arguments. The GGMLVIZ importer writes them, the RPC join (`analysis::rpc_join`) reads them
//! and adds the flow, the exporters draw the flow.

/// The category of the hook's RPC spans.
pub const CATEGORY: &str = "rpc";
/// Argument keys of an RPC span.
pub const PART: &str = "rpc_part";
pub const CONNECTION: &str = "connection";
pub const INDEX: &str = "index";
pub const ENDPOINT: &str = "endpoint";
pub const SENT: &str = "sent";
pub const RECEIVED: &str = "received";

/// The argument that ties a client's request to the server's serving of it: the same number on
/// both spans (exporters draw it as a flow).
pub const FLOW: &str = "flow_id";
