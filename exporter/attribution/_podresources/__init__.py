"""Generated kubelet pod-resources v1 client code (see api.proto). Do not edit."""
