package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// maxBody bounds control-plane request bodies.
const maxBody = 1 << 20

// unknownFieldError is a request member the endpoint does not know; the
// API answers it as Pydantic does an extra field (422, type
// extra_forbidden), with the member's dotted path as the location.
type unknownFieldError struct{ path string }

func (e *unknownFieldError) Error() string { return e.path + ": unknown field" }

// Unwrap makes an unknownFieldError an ErrInvalid.
func (e *unknownFieldError) Unwrap() error { return errdefs.ErrInvalid }

// rawSchemas gives the shape of members a request keeps as raw JSON (the
// manager stores and the proxy parses them), so that their unknown members
// are refused at the edge like any other: a misspelt allow_list must not
// leave a sandbox's egress open.
var rawSchemas = map[string]reflect.Type{
	"proxy_config": reflect.TypeFor[protocol.ProxyConfig](),
}

// decode reads a JSON body into v. Malformed JSON, a member of the wrong
// type and a member v does not model (at any depth) are 422s naming the
// member; a body over maxBody is a 413; an empty body leaves v zero.
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	var me *http.MaxBytesError
	if errors.As(err, &me) {
		return fmt.Errorf("request body over %d bytes: %w", maxBody, errdefs.ErrTooLarge)
	}
	if err != nil {
		return fmt.Errorf("read request body: %v: %w", err, errdefs.ErrInvalid)
	}
	return decodeBytes(body, v)
}

// decodeBytes is decode on a body already read.
func decodeBytes(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return fmt.Errorf("request body must be a JSON object: %w", errdefs.ErrInvalid)
			}
			return errdefs.Field(te.Field, "must be of type %s", te.Type)
		}
		return fmt.Errorf("decode request body: %v: %w", err, errdefs.ErrInvalid)
	}
	var tree any
	if err := json.Unmarshal(body, &tree); err != nil {
		return fmt.Errorf("decode request body: %v: %w", err, errdefs.ErrInvalid)
	}
	if p, ok := unknownMember(tree, reflect.TypeOf(v), ""); ok {
		return &unknownFieldError{path: p}
	}
	return nil
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// unknownMember returns the dotted path (indices as [i]) of the first
// object member of tree that type t does not model, and whether there is
// one. It matches
// names as encoding/json does (exact, else case-insensitive), descends
// into structs, maps, slices and the raw members named in rawSchemas, and
// stops at any other raw or interface member. encoding/json's
// DisallowUnknownFields would name neither the path nor look into raw
// members, hence this walk.
func unknownMember(tree any, t reflect.Type, path string) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch node := tree.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Map:
			for _, k := range sortedKeys(node) {
				if p, ok := unknownMember(node[k], t.Elem(), join(path, k)); ok {
					return p, true
				}
			}
		case reflect.Struct:
			fields := jsonFields(t)
			for _, k := range sortedKeys(node) {
				ft, ok := fields[k]
				if !ok {
					ft, ok = foldLookup(fields, k)
				}
				if !ok {
					return join(path, k), true
				}
				if ft == rawMessageType {
					if ft, ok = rawSchemas[k]; !ok {
						continue
					}
				}
				if p, ok := unknownMember(node[k], ft, join(path, k)); ok {
					return p, true
				}
			}
		}
	case []any:
		if t.Kind() == reflect.Slice && t != rawMessageType {
			for i, el := range node {
				if p, ok := unknownMember(el, t.Elem(), path+"["+strconv.Itoa(i)+"]"); ok {
					return p, true
				}
			}
		}
	}
	return "", false
}

// jsonFields maps the JSON member names of struct type t (embedded
// structs flattened) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func foldLookup(fields map[string]reflect.Type, k string) (reflect.Type, bool) {
	for name, t := range fields {
		if strings.EqualFold(name, k) {
			return t, true
		}
	}
	return nil, false
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// join appends member k to path; an empty name shows as "".
func join(path, k string) string {
	if k == "" {
		k = `""`
	}
	if path == "" {
		return k
	}
	return path + "." + k
}
