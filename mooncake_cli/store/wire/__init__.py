"""Between the store's clients and its master: the messages (protocol.py), the client's
connection over zmq (rpc.py) and the same-host lane both sides speak (fastlane.py). The master's
server is mooncake_cli.store.service."""
