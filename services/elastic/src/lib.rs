//! Elastic allocation, without IO: the time-windowed share policies of `policies/elastic.toml`,
//! demand forecasting with a seasonal model (Holt-Winters), queue waits of request-serving
//! replicas (Erlang C), and the fleet simulation that `allot bench elastic` runs to compare
//! exclusive whole-GPU allocation, static sharing and elastic sharing with forecasting.

pub mod forecast;
pub mod live;
pub mod policy;
pub mod queue;
pub mod sim;

pub use forecast::{HoltWinters, mape};
pub use policy::{ElasticPolicy, PolicyError};
pub use sim::{ModeReport, Report, SimConfig, simulate};
