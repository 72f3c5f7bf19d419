"""Tools agents reach outside the service: MCP servers, users' HTTP tools, tool policies."""
