package protocol

import (
	"reflect"
	"testing"
)

// TestLayerOrder checks spec §4.3: user and work_dir replace the layer
// below when set, env_vars merge key by key, and nil changes nothing.
func TestLayerOrder(t *testing.T) {
	image := RunConfig{User: "root", WorkDir: "/", EnvVars: map[string]string{"PATH": "/bin", "LAYER": "image"}}
	snapshot := &RunConfig{WorkDir: "/srv", EnvVars: map[string]string{"LAYER": "snapshot", "S": "1"}}
	sandbox := &RunConfig{User: "app", EnvVars: map[string]string{"LAYER": "sandbox"}}
	command := &RunConfig{User: "0", EnvVars: map[string]string{"C": "1"}}
	got := image.Layer(snapshot).Layer(sandbox).Layer(command)
	want := RunConfig{User: "0", WorkDir: "/srv", EnvVars: map[string]string{"PATH": "/bin", "LAYER": "sandbox", "S": "1", "C": "1"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("layered %+v, want %+v", got, want)
	}
	if mid := image.Layer(snapshot).Layer(sandbox); mid.User != "app" || mid.WorkDir != "/srv" {
		t.Fatalf("sandbox layer %+v", mid)
	}
	if same := image.Layer(nil); !reflect.DeepEqual(same, image) {
		t.Fatalf("nil layer changed %+v into %+v", image, same)
	}
	image.Layer(command).EnvVars["X"] = "y"
	if _, leaked := image.EnvVars["X"]; leaked {
		t.Fatal("Layer returned a map shared with its receiver")
	}
}

func TestProxyEnvVars(t *testing.T) {
	raw := []byte(`{"rules":[{"name":"gh","env_vars":{"GH_TOKEN":"dummy","A":"1"}},{"name":"off","enabled":false,"env_vars":{"OFF":"x"}},{"name":"b","env_vars":{"A":"2"}}]}`)
	got := ProxyEnvVars(raw)
	if len(got) != 2 || got["GH_TOKEN"] != "dummy" || got["A"] != "2" {
		t.Fatalf("ProxyEnvVars = %v", got)
	}
	if ProxyEnvVars(nil) != nil || ProxyEnvVars([]byte(`{"rules":[]}`)) != nil {
		t.Fatal("env vars from an empty config")
	}
}
