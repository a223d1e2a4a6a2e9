// Package deploy holds ipvsproxy's Kubernetes manifests and the code that
// checks them against a real API server: the e2e sandbox calls Apply, so
// every manifest is proven to be accepted by kube-apiserver, not only to
// parse. The binary does not import this package.
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// Files are the kustomization and the manifests it lists.
//
//go:embed kustomization.yaml serviceaccount.yaml rbac.yaml configmap.yaml daemonset.yaml
var Files embed.FS

// FieldManager is the server-side apply field manager of Apply.
const FieldManager = "ipvsproxy-deploy-check"

// Doc is one YAML document of a manifest.
type Doc struct {
	File string
	YAML []byte
	Meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
}

// Resources returns the files kustomization.yaml lists, in order.
func Resources() ([]string, error) {
	data, err := Files.ReadFile("kustomization.yaml")
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	return k.Resources, nil
}

// Docs returns every document of the kustomization's resources: exactly
// what `kubectl apply -k deploy/` sends, as the kustomization has no
// transformers.
func Docs() ([]Doc, error) {
	files, err := Resources()
	if err != nil {
		return nil, err
	}
	var out []Doc
	for _, f := range files {
		data, err := Files.ReadFile(f)
		if err != nil {
			return nil, err
		}
		docs, err := SplitDocs(f, data)
		if err != nil {
			return nil, err
		}
		out = append(out, docs...)
	}
	return out, nil
}

// SplitDocs splits a multi-document YAML file, skipping empty documents.
func SplitDocs(file string, data []byte) ([]Doc, error) {
	var out []Doc
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		b, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		d := Doc{File: file, YAML: b}
		if err := yaml.Unmarshal(b, &d.Meta); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if d.Meta.Kind == "" {
			continue // comments only
		}
		out = append(out, d)
	}
}

// Apply server-side-applies every manifest to the cluster behind c, as
// `kubectl apply --server-side -k deploy/` would, so admission and
// validation run for real. The DaemonSet is always a dry run (its pods
// would need the image and privileges the sandbox does not give); with
// dryRunAll everything is. Objects it really applies are owned by
// FieldManager; Delete removes them.
func Apply(ctx context.Context, c kubernetes.Interface, dryRunAll bool) error {
	docs, err := Docs()
	if err != nil {
		return err
	}
	for _, d := range docs {
		if err := applyDoc(ctx, c, d, dryRunAll || d.Meta.Kind == "DaemonSet"); err != nil {
			return fmt.Errorf("apply %s %s/%s (%s): %w", d.Meta.Kind, d.Meta.Metadata.Namespace, d.Meta.Metadata.Name, d.File, err)
		}
	}
	return nil
}

func applyDoc(ctx context.Context, c kubernetes.Interface, d Doc, dryRun bool) error {
	body, err := yaml.YAMLToJSON(d.YAML)
	if err != nil {
		return err
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: &force}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	name, ns, pt := d.Meta.Metadata.Name, d.Meta.Metadata.Namespace, types.ApplyPatchType
	switch d.Meta.APIVersion + " " + d.Meta.Kind {
	case "v1 ServiceAccount":
		_, err = c.CoreV1().ServiceAccounts(ns).Patch(ctx, name, pt, body, opts)
	case "v1 ConfigMap":
		_, err = c.CoreV1().ConfigMaps(ns).Patch(ctx, name, pt, body, opts)
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		_, err = c.RbacV1().ClusterRoles().Patch(ctx, name, pt, body, opts)
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		_, err = c.RbacV1().ClusterRoleBindings().Patch(ctx, name, pt, body, opts)
	case "apps/v1 DaemonSet":
		_, err = c.AppsV1().DaemonSets(ns).Patch(ctx, name, pt, body, opts)
	default:
		err = fmt.Errorf("deploy.Apply does not know this kind; add it")
	}
	return err
}

// Delete removes what Apply really created (not the dry-run DaemonSet),
// so a shared sandbox is left as it was. Missing objects are fine.
func Delete(ctx context.Context, c kubernetes.Interface) error {
	docs, err := Docs()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range docs {
		name, ns := d.Meta.Metadata.Name, d.Meta.Metadata.Namespace
		var err error
		switch d.Meta.Kind {
		case "ServiceAccount":
			err = c.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{})
		case "ConfigMap":
			err = c.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{})
		case "ClusterRole":
			err = c.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
		case "ClusterRoleBinding":
			err = c.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
