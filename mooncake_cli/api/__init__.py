"""The typed edges of the serving roles: every message between the conductor, the workers and
OpenAI clients (`openai`, `roles`), the error codes and the domain error they travel in
(`errors`). Domain code raises `ServingError`; only the HTTP edge (`mooncake_cli.http.server`) turns
it into a status code and an OpenAI-style error body."""
