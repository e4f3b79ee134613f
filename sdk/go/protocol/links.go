package protocol

// ServiceTokenHeader carries a service URL's token (spec §9.1). The gateway
// accepts it instead of an API key and strips it before forwarding.
const ServiceTokenHeader = "X-Langsmith-Sandbox-Service-Token"

// Login-mode access levels of a service URL (spec §9.2).
const (
	// AccessRestricted admits the sandbox's creator and the workspace's admins.
	AccessRestricted = "restricted"
	// AccessWorkspace admits any API key of the sandbox's workspace.
	AccessWorkspace = "workspace"
)

// Download link dispositions (spec X2).
const (
	DispositionAttachment = "attachment"
	DispositionInline     = "inline"
)

// ServiceURLRequest is the body of POST /boxes/{name}/service-url (spec X3).
// ExpiresInSeconds belongs to token mode and Access to login mode; sending
// both is invalid.
type ServiceURLRequest struct {
	Port             int    `json:"port"`
	ExpiresInSeconds *int64 `json:"expires_in_seconds,omitempty"`
	Access           string `json:"access,omitempty"`
	// EmbedOrigins may show the URL in an iframe: at most 5, each
	// https://host[:port] (http only for localhost).
	EmbedOrigins []string `json:"embed_origins,omitempty"`
}

// ServiceURLResponse is the answer to ServiceURLRequest. Token and
// ExpiresAt are empty in login mode; Access is empty in token mode.
type ServiceURLResponse struct {
	ServiceURL string `json:"service_url"`
	BrowserURL string `json:"browser_url"`
	Token      string `json:"token,omitempty"`
	ExpiresAt  string `json:"expires_at,omitempty"`
	Access     string `json:"access,omitempty"`
	// EmbedURL is the page to frame (token mode with embed_origins);
	// EmbedOrigins the origins as normalized.
	EmbedURL     string   `json:"embed_url,omitempty"`
	EmbedOrigins []string `json:"embed_origins,omitempty"`
}

// DownloadURLRequest is the body of POST /boxes/{name}/download-url (spec X2).
type DownloadURLRequest struct {
	Path               string `json:"path"`
	ExpiresInSeconds   *int64 `json:"expires_in_seconds,omitempty"`
	ContentType        string `json:"content_type,omitempty"`
	ContentDisposition string `json:"content_disposition,omitempty"`
}

// DownloadURLResponse is the answer to DownloadURLRequest. ExpiresAt is nil
// (JSON null) for a link that never expires.
type DownloadURLResponse struct {
	DownloadURL string  `json:"download_url"`
	Token       string  `json:"token"`
	ExpiresAt   *string `json:"expires_at"`
}
