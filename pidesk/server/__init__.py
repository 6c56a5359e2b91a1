"""The protocol server: JSON-RPC 2.0 over HTTP and WebSocket, auth at the door — translation only."""
