package api

import (
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/registry"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// registryAPI serves /registries (spec §3.4) from one registry service.
type registryAPI struct {
	registries Registries
}

// EnableRegistries serves the registries API from svc under every
// control-plane prefix (the official client uses /api/v2/sandboxes). Call
// it before serving; without it, or with a nil svc, those paths answer
// 404.
func (s *Server) EnableRegistries(svc *registry.Service) {
	var r Registries // nil, not a nil *registry.Service, when absent
	if svc != nil {
		r = svc
	}
	s.enableRegistries(r)
}

func (s *Server) enableRegistries(svc Registries) {
	ra := &registryAPI{registries: svc}
	for _, p := range prefixes {
		s.handle("POST "+p+"/registries", jsonHandler(http.StatusCreated, nil, ra.createRegistry))
		s.handle("GET "+p+"/registries", jsonHandler(http.StatusOK, nil, ra.listRegistries))
		s.handle("GET "+p+"/registries/{name}", jsonHandler(http.StatusOK, nil, ra.getRegistry))
		s.handle("PATCH "+p+"/registries/{name}", jsonHandler(http.StatusOK, nil, ra.updateRegistry))
		s.handle("DELETE "+p+"/registries/{name}", jsonHandler(http.StatusOK, nil, ra.deleteRegistry))
	}
}

// service returns the registry service, or ErrNotFound when none is
// configured.
func (s *registryAPI) service() (Registries, error) {
	if s.registries == nil {
		return nil, fmt.Errorf("registries are not configured on this server: %w", errdefs.ErrNotFound)
	}
	return s.registries, nil
}

// registryResult encodes what a call on one registry returned.
func registryResult(reg *store.Registry, err error) (protocol.Registry, error) {
	if err != nil {
		return protocol.Registry{}, err
	}
	return registry.JSON(reg), nil
}

func (s *registryAPI) createRegistry(r *http.Request, req protocol.CreateRegistryRequest) (protocol.Registry, error) {
	svc, err := s.service()
	if err != nil {
		return protocol.Registry{}, err
	}
	return registryResult(svc.Create(r.Context(), req))
}

func (s *registryAPI) listRegistries(r *http.Request, _ none) (protocol.RegistryList, error) {
	svc, err := s.service()
	if err != nil {
		return protocol.RegistryList{}, err
	}
	o, err := listOptions(r, "registries")
	if err != nil {
		return protocol.RegistryList{}, err
	}
	list, err := svc.List(r.Context(), o.page())
	if err != nil {
		return protocol.RegistryList{}, err
	}
	list, next := pageOf[*store.Registry](o, list, nil)
	out := make([]protocol.Registry, len(list))
	for i, reg := range list {
		out[i] = registry.JSON(reg)
	}
	return protocol.RegistryList{Registries: out, Items: out, Offset: o.Offset, NextCursor: next}, nil
}

func (s *registryAPI) getRegistry(r *http.Request, _ none) (protocol.Registry, error) {
	svc, err := s.service()
	if err != nil {
		return protocol.Registry{}, err
	}
	return registryResult(svc.Get(r.Context(), r.PathValue("name")))
}

func (s *registryAPI) updateRegistry(r *http.Request, req protocol.UpdateRegistryRequest) (protocol.Registry, error) {
	svc, err := s.service()
	if err != nil {
		return protocol.Registry{}, err
	}
	return registryResult(svc.Update(r.Context(), r.PathValue("name"), req))
}

func (s *registryAPI) deleteRegistry(r *http.Request, _ none) (noContent, error) {
	svc, err := s.service()
	if err != nil {
		return noContent{}, err
	}
	return noContent{}, svc.Delete(r.Context(), r.PathValue("name"))
}
