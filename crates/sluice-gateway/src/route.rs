//! The routing table: what the gateway does with each method. Pure code.
//!
//! Later components plug in here: cacheable methods (cache), pool methods (mempool).

/// Where a call is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Forwarded to the upstreams as it is.
    PassThrough,
    /// Only meaningful on a WebSocket connection (subscriptions); answered with an error over HTTP.
    SocketOnly,
}

/// Methods that need a connection that outlives the call.
pub fn is_subscription_method(method: &str) -> bool {
    matches!(method, "eth_subscribe" | "eth_unsubscribe")
}

/// Methods that submit a signed transaction (they have effects and may wait on verification).
pub fn is_submission(method: &str) -> bool {
    matches!(method, "eth_sendRawTransaction" | "eth_sendRawTransactionSync" | "eth_sendRawTransactionConditional")
}

/// Decides where a call goes. Subscriptions on a WebSocket are handled by the socket session
/// before reaching the pipeline, so the pipeline only sees them over HTTP.
pub fn route(method: &str) -> Route {
    if is_subscription_method(method) {
        Route::SocketOnly
    } else {
        Route::PassThrough
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_need_a_socket_and_the_rest_passes_through() {
        assert_eq!(route("eth_subscribe"), Route::SocketOnly);
        assert_eq!(route("eth_unsubscribe"), Route::SocketOnly);
        assert_eq!(route("eth_call"), Route::PassThrough);
        assert_eq!(route("no_such_method"), Route::PassThrough);
    }
}
