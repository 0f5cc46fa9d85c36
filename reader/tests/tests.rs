//! The reader's integration tests, one binary: the format round trip, damage, following a
//! growing file, the sample files of other tools, the telemetry importers and exporters.

mod common;
mod damage;
mod follow;
mod roundtrip;
mod samples;
mod telemetry;
mod telemetry_v2;
