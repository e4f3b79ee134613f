package api

import (
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/registry"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// registryAPI serves /registries (spec §3.4) from one registry.Service.
type registryAPI struct {
	registries *registry.Service
}

// EnableRegistries serves the registries API from svc under every
// control-plane prefix (the official client uses /api/v2/sandboxes). Call
// it before serving; without it those paths answer 404.
func (s *Server) EnableRegistries(svc *registry.Service) {
	ra := &registryAPI{registries: svc}
	for _, p := range prefixes {
		s.handle("POST "+p+"/registries", ra.createRegistry)
		s.handle("GET "+p+"/registries", ra.listRegistries)
		s.handle("GET "+p+"/registries/{name}", ra.getRegistry)
		s.handle("PATCH "+p+"/registries/{name}", ra.updateRegistry)
		s.handle("DELETE "+p+"/registries/{name}", ra.deleteRegistry)
	}
}

// registriesOn reports whether a registry service is configured, answering
// 404 itself when it is not.
func (s *registryAPI) registriesOn(w http.ResponseWriter, r *http.Request) bool {
	if s.registries == nil {
		writeError(r.Context(), w, fmt.Errorf("registries are not configured on this server: %w", errdefs.ErrNotFound))
		return false
	}
	return true
}

func (s *registryAPI) createRegistry(w http.ResponseWriter, r *http.Request) {
	if !s.registriesOn(w, r) {
		return
	}
	var req protocol.CreateRegistryRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	reg, err := s.registries.Create(r.Context(), req)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusCreated, registry.JSON(reg))
}

func (s *registryAPI) listRegistries(w http.ResponseWriter, r *http.Request) {
	if !s.registriesOn(w, r) {
		return
	}
	o, err := listOptions(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	list, err := s.registries.List(r.Context(), o)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	out := make([]protocol.Registry, len(list))
	for i, reg := range list {
		out[i] = registry.JSON(reg)
	}
	writeJSON(w, http.StatusOK, protocol.RegistryList{Registries: out, Items: out, Offset: o.Offset, NextCursor: nextCursor(o, len(out))})
}

func (s *registryAPI) getRegistry(w http.ResponseWriter, r *http.Request) {
	if !s.registriesOn(w, r) {
		return
	}
	reg, err := s.registries.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, registry.JSON(reg))
}

func (s *registryAPI) updateRegistry(w http.ResponseWriter, r *http.Request) {
	if !s.registriesOn(w, r) {
		return
	}
	var req protocol.UpdateRegistryRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	reg, err := s.registries.Update(r.Context(), r.PathValue("name"), req)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, registry.JSON(reg))
}

func (s *registryAPI) deleteRegistry(w http.ResponseWriter, r *http.Request) {
	if !s.registriesOn(w, r) {
		return
	}
	if err := s.registries.Delete(r.Context(), r.PathValue("name")); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
