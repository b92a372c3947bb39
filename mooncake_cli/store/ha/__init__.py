"""The store's high availability through etcd: following the leader (leader.py, the client's and
the tools' side) and standing for election (election.py, the master's side)."""
