//! Where the gateway answers a call, by its method's class in the method table. Pure code.

use sluice_chain::methods::{Class, MethodInfo};

/// Where a call is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Forwarded to the upstreams as it is.
    PassThrough,
    /// Only meaningful on a WebSocket connection (subscriptions); answered with an error over HTTP.
    SocketOnly,
}

/// Decides where a call goes. Subscriptions on a WebSocket are handled by the socket session
/// before reaching the pipeline, so the pipeline only sees them over HTTP.
pub fn route(method: &MethodInfo) -> Route {
    if method.class == Class::Subscription {
        Route::SocketOnly
    } else {
        Route::PassThrough
    }
}

#[cfg(test)]
mod tests {
    use sluice_chain::method_info;

    use super::*;

    #[test]
    fn subscriptions_need_a_socket_and_the_rest_passes_through() {
        assert_eq!(route(method_info("eth_subscribe")), Route::SocketOnly);
        assert_eq!(route(method_info("eth_unsubscribe")), Route::SocketOnly);
        assert_eq!(route(method_info("eth_call")), Route::PassThrough);
        assert_eq!(route(method_info("no_such_method")), Route::PassThrough);
    }
}
